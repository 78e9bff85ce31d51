{#- The VM's resolvers, written into its root filesystem from the compute
    node. Data: pillar mccloud (vm, rootfs). #}
{%- set d = pillar['mccloud'] %}
{%- set resolv = d.rootfs ~ '/etc/resolv.conf' %}
{%- set lines = ['# Managed by mccloud'] %}
{%- for ns in d.vm.dnsservers %}{% do lines.append('nameserver ' ~ ns) %}{% endfor %}
include:
  - makina-states.cloud.generic.vm.rootfs_guard

mccloud-vm-resolv-unlink:
  file.absent:
    - failhard: true
    - name: {{ resolv | tojson }}
    - onlyif:
      - fun: file.is_link
        path: {{ resolv | tojson }}
    - require:
      - test: mccloud-vm-rootfs-guard

mccloud-vm-resolv:
  file.managed:
    - failhard: true
    - name: {{ resolv | tojson }}
    - makedirs: true
    - follow_symlinks: false
    - contents: {{ (lines | join('\n') ~ '\n') | tojson }}
    - require:
      - file: mccloud-vm-resolv-unlink
