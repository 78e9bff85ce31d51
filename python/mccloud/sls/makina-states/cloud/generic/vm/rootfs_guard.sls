{#- The compute node writes into VM root filesystems as root. A VM's root
    could plant a symlink there pointing at the host's own files: refuse to
    go on when any path the states write through is a symlink. #}
{%- set d = pillar['mccloud'] %}
{%- set paths = ['etc', 'etc/shadow', 'etc/salt', 'etc/salt/grains', 'etc/network',
                 'etc/network/interfaces', 'root', 'root/.ssh', 'root/.ssh/authorized_keys',
                 'this_host', 'this_port'] %}
mccloud-vm-rootfs-guard:
  test.fail_without_changes:
    - name: rootfs guard of {{ d.rootfs }}
    - comment: a path under {{ d.rootfs }} is a symlink; refusing to write through it
    - onlyif: |
        for p in {{ paths | join(' ') }}; do test -L "{{ d.rootfs }}/$p" && exit 0; done; exit 1
