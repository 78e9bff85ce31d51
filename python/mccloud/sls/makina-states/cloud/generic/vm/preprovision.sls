{#- Generic VM preprovisioning, from the compute node into the VM's root
    filesystem: markers /this_host (compute node id) and /this_port (ssh
    reverse-proxy port), the cloud grains, the controller's public key for
    root, and the VM's registry (registry.sls). Every write goes through
    mccloud_rootfs, which never follows a link the VM planted. Data: the
    job's (vm, target, rootfs, controller_pubkey, vm_registry). #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
include:
  - makina-states.cloud.generic.vm.registry
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}
{%- set root = d.rootfs | string %}

mccloud-vm-controller-key-known{{ s }}:
  test.configurable_test_state:
    - failhard: true
    - name: the controller's public key is known
    - changes: false
    - result: {{ (d.controller_pubkey | string | length > 0) | tojson }}
    - allow_test_mode_failure: true
    - comment: {{ ('the controller has a public key' if d.controller_pubkey else
                   'the controller has no ssh key pair yet: run mc_cloud_controller.deploy first') | tojson }}

mccloud-vm-this-host{{ s }}:
  mccloud_rootfs.managed:
    - failhard: true
    - name: /this_host
    - root: {{ root | tojson }}
    - contents: {{ d.target | string | tojson }}

mccloud-vm-this-port{{ s }}:
  mccloud_rootfs.managed:
    - failhard: true
    - name: /this_port
    - root: {{ root | tojson }}
    - contents: {{ d.vm.ssh_reverse_proxy_port | string | tojson }}

mccloud-vm-grains{{ s }}:
  mccloud_rootfs.merged:
    - failhard: true
    - name: /etc/salt/grains
    - root: {{ root | tojson }}
    - dataset:
        makina-states.cloud.is.vm: true

mccloud-vm-root-ssh{{ s }}:
  mccloud_rootfs.directory:
    - failhard: true
    - name: /root/.ssh
    - root: {{ root | tojson }}
    - mode: '0700'

mccloud-vm-controller-key{{ s }}:
  mccloud_rootfs.line:
    - failhard: true
    - name: /root/.ssh/authorized_keys
    - root: {{ root | tojson }}
    - text: {{ d.controller_pubkey | string | tojson }}
    - mode: '0600'
    - require:
      - mccloud_rootfs: mccloud-vm-root-ssh{{ s }}
      - test: mccloud-vm-controller-key-known{{ s }}
{%- endfor %}
