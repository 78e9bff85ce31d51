{#- The VM's resolvers, written into its root filesystem from the compute
    node. Data: pillar mccloud (vm, rootfs). #}
{%- set d = pillar['mccloud'] %}
include:
  - makina-states.cloud.generic.vm.rootfs_guard

mccloud-vm-resolv-unlink:
  file.absent:
    - name: {{ d.rootfs }}/etc/resolv.conf
    - onlyif: test -L {{ d.rootfs }}/etc/resolv.conf
    - require:
      - test: mccloud-vm-rootfs-guard

mccloud-vm-resolv:
  file.managed:
    - name: {{ d.rootfs }}/etc/resolv.conf
    - makedirs: true
    - follow_symlinks: false
    - contents: |
        # Managed by mccloud
        {%- for ns in d.vm.dnsservers %}
        nameserver {{ ns }}
        {%- endfor %}
    - require:
      - file: mccloud-vm-resolv-unlink
