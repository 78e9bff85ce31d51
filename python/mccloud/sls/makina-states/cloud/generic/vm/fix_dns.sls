{#- The VM's resolvers, written into its root filesystem from the compute
    node. Data: pillar mccloud (vm, rootfs). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
{%- set resolv = d.rootfs ~ '/etc/resolv.conf' %}
{%- set lines = ['# Managed by mccloud'] %}
{%- for ns in d.vm.dnsservers %}{% do lines.append('nameserver ' ~ ns) %}{% endfor %}
include:
  - makina-states.cloud.generic.vm.rootfs_guard

{#- A guest's resolv.conf is often a symlink (resolvconf, systemd-resolved):
    it is replaced by a file of its own. #}
mccloud-vm-resolv-unlink:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        if [ -L "$MCCLOUD_RESOLV" ]; then
            rm -f -- "$MCCLOUD_RESOLV"
            echo "changed=yes comment='symlink removed'"
        else
            echo "changed=no comment='not a symlink'"
        fi
    - env:
        MCCLOUD_RESOLV: {{ resolv | string | tojson }}
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
      - cmd: mccloud-vm-resolv-unlink
