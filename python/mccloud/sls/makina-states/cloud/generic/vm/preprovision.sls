{#- Generic VM preprovisioning, from the compute node into the VM's root
    filesystem: markers /this_host (compute node id) and /this_port (ssh
    reverse-proxy port), the cloud grains, the controller's public key for
    root, and the VM's registry (registry.sls). Data: pillar mccloud (vm,
    target, rootfs, controller_pubkey, vm_registry). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
{%- set root = d.rootfs %}
include:
  - makina-states.cloud.generic.vm.rootfs_guard
  - makina-states.cloud.generic.vm.registry

mccloud-vm-controller-key-known:
  test.configurable_test_state:
    - failhard: true
    - name: the controller's public key is known
    - changes: false
    - result: {{ (d.controller_pubkey | string | length > 0) | tojson }}
    - allow_test_mode_failure: true
    - comment: {{ ('the controller has a public key' if d.controller_pubkey else
                   'the controller has no ssh key pair yet: run mc_cloud_controller.deploy first') | tojson }}

mccloud-vm-this-host:
  file.managed:
    - failhard: true
    - name: {{ (root ~ '/this_host') | tojson }}
    - contents: {{ d.target | string | tojson }}
    - follow_symlinks: false
    - require:
      - test: mccloud-vm-rootfs-guard

mccloud-vm-this-port:
  file.managed:
    - failhard: true
    - name: {{ (root ~ '/this_port') | tojson }}
    - contents: {{ d.vm.ssh_reverse_proxy_port | string | tojson }}
    - follow_symlinks: false
    - require:
      - test: mccloud-vm-rootfs-guard

mccloud-vm-grains:
  file.serialize:
    - failhard: true
    - name: {{ (root ~ '/etc/salt/grains') | tojson }}
    - makedirs: true
    - serializer: yaml
    - merge_if_exists: true
    - dataset:
        makina-states.cloud.is.vm: true
    - require:
      - test: mccloud-vm-rootfs-guard

mccloud-vm-root-ssh:
  file.directory:
    - failhard: true
    - name: {{ (root ~ '/root/.ssh') | tojson }}
    - makedirs: true
    - mode: '0700'
    - require:
      - test: mccloud-vm-rootfs-guard

mccloud-vm-controller-key:
  file.append:
    - failhard: true
    - name: {{ (root ~ '/root/.ssh/authorized_keys') | tojson }}
    - text: {{ d.controller_pubkey | string | tojson }}
    - require:
      - test: mccloud-vm-rootfs-guard
      - file: mccloud-vm-root-ssh
      - test: mccloud-vm-controller-key-known
