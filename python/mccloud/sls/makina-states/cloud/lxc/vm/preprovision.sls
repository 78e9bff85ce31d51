{#- lxc part of preprovisioning: the lxc VM grains. #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}

mccloud-lxc-vm-grains{{ s }}:
  mccloud_rootfs.merged:
    - failhard: true
    - name: /etc/salt/grains
    - root: {{ d.rootfs | string | tojson }}
    - dataset:
        makina-states.cloud.is.lxcvm: true
        makina-states.nodetypes.lxccontainer: true
{%- endfor %}
