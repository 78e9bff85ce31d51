{#- Controller layout: the registry directory and the controller's ssh key
    pair (used to reach compute nodes and VMs). Data: pillar mccloud. #}
{%- set d = pillar['mccloud'] %}
mccloud-controller-store-dir:
  file.directory:
    - name: {{ d.store_dir }}
    - makedirs: true
    - mode: '0700'

mccloud-controller-ssh-dir:
  file.directory:
    - name: {{ salt['file.dirname'](d.ssh_key) }}
    - makedirs: true
    - mode: '0700'

mccloud-controller-ssh-key:
  cmd.run:
    - name: ssh-keygen -q -t ed25519 -N '' -C mccloud-controller -f {{ d.ssh_key }}
    - creates: {{ d.ssh_key }}
    - require:
      - file: mccloud-controller-ssh-dir

mccloud-controller-grain:
  grains.present:
    - name: makina-states.cloud.is.controller
    - value: true
