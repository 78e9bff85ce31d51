{#- Firewall: an iptables chain accepting http/https and the allocated
    ssh/snmp reverse-proxy ports, jumped to from INPUT. Accept rules only:
    nothing already allowed is closed. The script is re-run whenever the
    chain does not carry the digest of the current script (changed rules,
    reboot). #}
{%- set d = pillar['mccloud'] %}
{%- set c = d.conf %}
{%- if d.has.firewall %}
{%- set chain = c.firewall_chain %}
{%- set script = '/etc/mccloud/firewall-' ~ chain ~ '.sh' %}
{%- set ssh = d.vms.values() | map(attribute='ssh_reverse_proxy_port') | list %}
{%- set snmp = d.vms.values() | map(attribute='snmp_reverse_proxy_port') | list %}
mccloud-firewall-pkg:
  pkg.installed:
    - name: iptables

mccloud-firewall-script:
  file.managed:
    - name: {{ script }}
    - makedirs: true
    - mode: '0755'
    - contents: |
        #!/bin/sh
        # Managed by mccloud: reverse-proxy ports of compute node {{ d.target }}.
        set -e
        C={{ chain }}
        iptables -N "$C" 2>/dev/null || iptables -F "$C"
        iptables -C INPUT -j "$C" 2>/dev/null || iptables -I INPUT -j "$C"
        iptables -A "$C" -p tcp -m multiport --dports {{ c.http_port }},{{ c.https_port }} -j ACCEPT
        {%- for i in range(0, ssh | length, 15) %}
        iptables -A "$C" -p tcp -m multiport --dports {{ ssh[i:i + 15] | join(',') }} -j ACCEPT
        {%- endfor %}
        {%- for i in range(0, snmp | length, 15) %}
        iptables -A "$C" -p udp -m multiport --dports {{ snmp[i:i + 15] | join(',') }} -j ACCEPT
        {%- endfor %}
        iptables -A "$C" -m comment --comment "mccloud-$(sha1sum < "$0" | cut -c1-12)" -j RETURN

mccloud-firewall-apply:
  cmd.run:
    - name: {{ script }}
    - unless: iptables -S {{ chain }} 2>/dev/null | grep -q "mccloud-$(sha1sum < {{ script }} | cut -c1-12)"
    - require:
      - pkg: mccloud-firewall-pkg
      - file: mccloud-firewall-script
{%- else %}

mccloud-firewall-disabled:
  test.nop:
    - name: makina-states.cloud.compute_node.has.firewall is false
{%- endif %}
