{#- lxc part of preprovisioning: the lxc VM grains. #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}

mccloud-lxc-vm-grains:
  mccloud_rootfs.merged:
    - failhard: true
    - name: /etc/salt/grains
    - root: {{ d.rootfs | string | tojson }}
    - dataset:
        makina-states.cloud.is.lxcvm: true
        makina-states.nodetypes.lxccontainer: true
