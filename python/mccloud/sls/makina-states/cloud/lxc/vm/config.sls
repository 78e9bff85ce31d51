{#- The container's lxc configuration from the registry: network (bridge,
    allocated MAC and IP, gateway), autostart, mount entries and raw
    lxc_conf lines, in one marked block at the end of its config file; a
    guest network configuration that does not wait for DHCP. A running
    container restarts when its configuration changed. #}
include:
  - makina-states.cloud.generic.vm.rootfs_guard

{%- set d = pillar['mccloud'] %}
{%- set v = d.vm %}
{%- set cfg = d.lxc_path ~ '/' ~ v.name ~ '/config' %}
{%- set block -%}
lxc.net.0.type = veth
lxc.net.0.link = {{ v.bridge }}
lxc.net.0.flags = up
lxc.net.0.name = eth0
lxc.net.0.hwaddr = {{ v.mac }}
lxc.net.0.ipv4.address = {{ v.ip }}/{{ v.netmask }}
lxc.net.0.ipv4.gateway = {{ v.gateway }}
lxc.start.auto = {{ 1 if v.autostart else 0 }}
{%- for line in v.fstab or [] %}
lxc.mount.entry = {{ line }}
{%- endfor %}
{%- for item in v.lxc_conf or [] %}
{%- for k, val in (item.items() if item is mapping else [(item, None)]) %}
{{ k if val is none else k ~ ' = ' ~ val }}
{%- endfor %}
{%- endfor %}
{%- endset %}
{%- set marker = '# mccloud settings ' ~ (block | sha256)[:16] %}
mccloud-lxc-vm-config:
  cmd.run:
    - name: |
        set -e
        sed -i -e '/^lxc\.net\./d' -e '/^lxc\.start\.auto/d' -e '/^# mccloud settings/,$d' {{ cfg }}
        {%- for key in v.lxc_conf_unset or [] %}
        sed -i -e '/^{{ key | regex_escape }}\s*=/d' {{ cfg }}
        {%- endfor %}
        cat >> {{ cfg }} <<'MCCLOUD_EOF'
        {{ marker }}
        {{ block | indent(8) }}
        MCCLOUD_EOF
    - unless: grep -qxF '{{ marker }}' {{ cfg }}

mccloud-lxc-vm-restart:
  cmd.run:
    - name: >-
        lxc-stop -P {{ d.lxc_path }} -n {{ v.name }} -t 30;
        lxc-start -P {{ d.lxc_path }} -n {{ v.name }} && lxc-wait -P {{ d.lxc_path }} -n {{ v.name }} -s RUNNING -t 60
    - onlyif: lxc-info -P {{ d.lxc_path }} -n {{ v.name }} -s | grep -q RUNNING
    - onchanges:
      - cmd: mccloud-lxc-vm-config

mccloud-lxc-vm-guest-network:
  file.managed:
    - name: {{ d.rootfs }}/etc/network/interfaces
    - makedirs: true
    - follow_symlinks: false
    - require:
      - test: mccloud-vm-rootfs-guard
    - contents: |
        # Managed by mccloud: LXC sets eth0's address from the container config.
        auto lo
        iface lo inet loopback

        auto eth0
        iface eth0 inet manual
