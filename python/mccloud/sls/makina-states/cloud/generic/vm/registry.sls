{#- The VM's registry (see mccloud.localreg), written from the compute node
    into the VM's root filesystem: what mc_cloud_vm.vm_settings answers
    inside the VM, in the original's keys. Written whole from the job's
    vm_registry at every provisioning, atomically, mode 0600, through
    mccloud_rootfs (never following a link the VM planted). #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- for j in jobs %}
{%- set d, job_key, s = j.job, j.key, j.sfx %}

mccloud-vm-registry{{ s }}:
  mccloud_rootfs.serialized:
    - failhard: true
    - name: /etc/makina-states/cloud_vm_settings.yaml
    - root: {{ d.rootfs | string | tojson }}
    - dataset_pillar: {{ job_key }}:vm_registry
    - mode: '0600'
{%- endfor %}
