{#- Initial setup: root's password from the registry's SHA-512 crypt hash
    (the clear text never reaches a state). Data: pillar mccloud. An
    overlayfs clone's upper layer holds only what the guest changed: its
    /etc/shadow is first copied up from the template (rootfs_lower), owner
    and mode kept, unless the clone already has its own. #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
include:
  - makina-states.cloud.generic.vm.rootfs_guard

{%- if d.get('rootfs_lower') %}
mccloud-lxc-vm-shadow-copy-up:
  file.copy:
    - failhard: true
    - name: {{ (d.rootfs ~ '/etc/shadow') | tojson }}
    - source: {{ (d.rootfs_lower ~ '/etc/shadow') | tojson }}
    - preserve: true
    - makedirs: true
    - require:
      - test: mccloud-vm-rootfs-guard
    - require_in:
      - file: mccloud-lxc-vm-root-password
{%- endif %}

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
