{#- Generic VM preprovisioning, from the compute node into the VM's root
    filesystem: markers /this_host (compute node id) and /this_port (ssh
    reverse-proxy port), the cloud grains, and the controller's public key
    for root. Data: pillar mccloud (vm, target, rootfs, controller_pubkey). #}
{%- set d = pillar['mccloud'] %}
{%- set root = d.rootfs %}
mccloud-vm-this-host:
  file.managed:
    - name: {{ root }}/this_host
    - contents: {{ d.target }}

mccloud-vm-this-port:
  file.managed:
    - name: {{ root }}/this_port
    - contents: "{{ d.vm.ssh_reverse_proxy_port }}"

mccloud-vm-grains:
  file.serialize:
    - name: {{ root }}/etc/salt/grains
    - makedirs: true
    - serializer: yaml
    - merge_if_exists: true
    - dataset:
        makina-states.cloud.is.vm: true

mccloud-vm-root-ssh:
  file.directory:
    - name: {{ root }}/root/.ssh
    - makedirs: true
    - mode: '0700'

mccloud-vm-controller-key:
  file.append:
    - name: {{ root }}/root/.ssh/authorized_keys
    - text: {{ d.controller_pubkey | json }}
    - require:
      - file: mccloud-vm-root-ssh
