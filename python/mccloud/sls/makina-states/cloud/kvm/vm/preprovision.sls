{#- kvm part of preprovisioning: the kvm VM grains, written into the seed
    tree (the guest reads them once its seed is applied). #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}

mccloud-kvm-vm-grains{{ s }}:
  mccloud_rootfs.merged:
    - failhard: true
    - name: /etc/salt/grains
    - root: {{ d.rootfs | string | tojson }}
    - dataset:
        makina-states.cloud.is.kvmvm: true
        makina-states.nodetypes.kvm: true
{%- endfor %}
