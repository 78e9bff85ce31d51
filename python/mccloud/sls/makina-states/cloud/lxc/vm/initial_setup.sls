{#- Initial setup: root's password from the registry's SHA-512 crypt hash
    (the clear text never reaches a state). Data: pillar mccloud. #}
{%- set d = pillar['mccloud'] %}
include:
  - makina-states.cloud.generic.vm.rootfs_guard

mccloud-lxc-vm-root-password:
  file.replace:
    - failhard: true
    - name: {{ (d.rootfs ~ '/etc/shadow') | tojson }}
    - pattern: '^root:[^:]*:'
    - repl: {{ ('root:' ~ (d.vm.password_hash | string | replace('\\', '\\\\')) ~ ':') | tojson }}
    - count: 1
    - show_changes: false
    - require:
      - test: mccloud-vm-rootfs-guard
