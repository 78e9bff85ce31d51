{#- Volumes: kvm VMs have no bind mounts (the core refuses an fstab for
    them); nothing to prepare on the node. #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}

mccloud-kvm-vm-no-volumes{{ s }}:
  test.nop:
    - failhard: true
    - name: {{ ('kvm VM ' ~ d.vm.name ~ ' has no bind mounts') | tojson }}
{%- endfor %}
