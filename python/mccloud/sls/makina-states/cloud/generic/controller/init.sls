{#- Controller layout: the registry directory and the controller's ssh key
    pair (used to reach compute nodes and VMs). Data: pillar mccloud;
    commands receive it through their environment only. #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
mccloud-controller-store-dir:
  file.directory:
    - name: {{ d.store_dir | tojson }}
    - makedirs: true
    - mode: '0700'

mccloud-controller-ssh-dir:
  file.directory:
    - name: {{ salt['file.dirname'](d.ssh_key) | tojson }}
    - makedirs: true
    - mode: '0700'

mccloud-controller-ssh-key:
  cmd.run:
    - stateful: true
    - name: |
        if [ -e "$MCCLOUD_SSH_KEY" ]; then echo "changed=no comment='key exists'"; exit 0; fi
        ssh-keygen -q -t ed25519 -N '' -C mccloud-controller -f "$MCCLOUD_SSH_KEY" || exit $?
        echo "changed=yes comment='key generated'"
    - env:
        MCCLOUD_SSH_KEY: {{ d.ssh_key | string | tojson }}
    - require:
      - file: mccloud-controller-ssh-dir

mccloud-controller-grain:
  grains.present:
    - name: makina-states.cloud.is.controller
    - value: true
