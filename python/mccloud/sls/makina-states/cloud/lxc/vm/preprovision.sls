{#- lxc part of preprovisioning: the lxc VM grains. #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
include:
  - makina-states.cloud.generic.vm.rootfs_guard

mccloud-lxc-vm-grains:
  file.serialize:
    - failhard: true
    - name: {{ (d.rootfs ~ '/etc/salt/grains') | tojson }}
    - makedirs: true
    - serializer: yaml
    - merge_if_exists: true
    - dataset:
        makina-states.cloud.is.lxcvm: true
        makina-states.nodetypes.lxccontainer: true
    - require:
      - test: mccloud-vm-rootfs-guard
