{#- The compute node writes into VM root filesystems as root. A VM's root
    could plant a symlink there pointing at the host's own files: refuse to
    go on when any path the states write through is a symlink. One command
    checks them all (the paths reach it through its environment, never its
    command line), and the aggregate state mccloud-vm-rootfs-guard is what
    the writing states require.

    mccloud's states check their preconditions inside their own commands
    rather than with onlyif/unless/creates: Salt answers each of those by
    looking up <state>.mod_run_check, which no state module defines, and
    that lookup loads every state module of the installation (about two
    seconds per job on a small node). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
{%- set paths = ['etc', 'etc/shadow', 'etc/salt', 'etc/salt/grains', 'etc/network',
                 'etc/network/interfaces', 'root', 'root/.ssh', 'root/.ssh/authorized_keys',
                 'this_host', 'this_port', 'etc/salt/minion.d', 'etc/salt/minion.d/mccloud.conf',
                 'etc/salt/minion.d/mccloud-local.conf', 'etc/salt/pki', 'etc/salt/pki/minion',
                 'etc/mastersalt', 'etc/mastersalt/grains', 'etc/mastersalt/minion.d',
                 'etc/mastersalt/minion.d/mccloud.conf', 'etc/mastersalt/pki', 'etc/mastersalt/pki/minion',
                 'usr', 'usr/local', 'usr/local/sbin', 'usr/local/sbin/mccloud-bootstrap-salt',
                 'etc/makina-states', 'etc/makina-states/cloud_vm_settings.yaml'] %}
mccloud-vm-rootfs-guard-paths:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        for p in $MCCLOUD_PATHS; do
            if [ -L "$MCCLOUD_ROOTFS/$p" ]; then
                echo "$MCCLOUD_ROOTFS/$p is a symlink: the VM could point it at the host's files; refusing to write through it" >&2
                exit 1
            fi
        done
        echo "changed=no comment='no path written through is a symlink'"
    - env:
        MCCLOUD_ROOTFS: {{ d.rootfs | string | tojson }}
        MCCLOUD_PATHS: {{ paths | join(' ') | tojson }}

mccloud-vm-rootfs-guard:
  test.succeed_without_changes:
    - failhard: true
    - name: no path the states write through under the VM's root filesystem is a symlink
    - require:
      - cmd: mccloud-vm-rootfs-guard-paths
