{#- The compute node writes into VM root filesystems as root. A VM's root
    could plant a symlink there pointing at the host's own files: refuse to
    go on when any path the states write through is a symlink. One check per
    path (no shell: file.is_link), and the aggregate state
    mccloud-vm-rootfs-guard that the writing states require. #}
{%- set d = pillar['mccloud'] %}
{%- set paths = ['etc', 'etc/shadow', 'etc/salt', 'etc/salt/grains', 'etc/network',
                 'etc/network/interfaces', 'root', 'root/.ssh', 'root/.ssh/authorized_keys',
                 'this_host', 'this_port'] %}
{%- for p in paths %}
{%- set path = d.rootfs ~ '/' ~ p %}
mccloud-vm-rootfs-guard-{{ p | replace('/', '-') | replace('.', '') }}:
  test.fail_without_changes:
    - failhard: true
    - name: {{ path | tojson }}
    - comment: {{ (path ~ ' is a symlink: the VM could point it at the host\'s files; refusing to write through it') | tojson }}
    - onlyif:
      - fun: file.is_link
        path: {{ path | tojson }}
{%- endfor %}

mccloud-vm-rootfs-guard:
  test.succeed_without_changes:
    - failhard: true
    - name: no path the states write through under the VM's root filesystem is a symlink
    - require:
{%- for p in paths %}
      - test: mccloud-vm-rootfs-guard-{{ p | replace('/', '-') | replace('.', '') }}
{%- endfor %}
