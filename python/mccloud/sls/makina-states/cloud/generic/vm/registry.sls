{#- The VM's registry (see mccloud.localreg), written from the compute node
    into the VM's root filesystem: what mc_cloud_vm.vm_settings answers
    inside the VM, in the original's keys. Written whole from pillar
    mccloud:vm_registry at every provisioning, atomically, mode 0600. #}
{%- from "makina-states/cloud/generic/job.jinja" import job, job_key with context %}
{%- set d = job %}
include:
  - makina-states.cloud.generic.vm.rootfs_guard

mccloud-vm-registry:
  file.serialize:
    - failhard: true
    - name: {{ (d.rootfs ~ '/etc/makina-states/cloud_vm_settings.yaml') | tojson }}
    - dataset_pillar: {{ job_key }}:vm_registry
    - serializer: yaml
    - makedirs: true
    - mode: '0600'
    - show_changes: false
    - require:
      - test: mccloud-vm-rootfs-guard
