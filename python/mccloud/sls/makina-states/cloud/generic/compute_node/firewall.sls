{#- Firewall: an iptables chain accepting http/https and the allocated
    ssh/snmp reverse-proxy ports, jumped to from INPUT. Accept rules only:
    nothing already allowed is closed. The snmp ports are forwarded: a
    chain of the same name in the nat table, jumped to from PREROUTING (and
    from OUTPUT for the node's own addresses), DNATs each VM's snmp port
    (udp) to its port 161; a VM's rule goes with the VM (destroy applies
    this state without it). The script is static: the chain and
    the ports reach it through the environment, never through a shell line.
    It is re-run whenever the chain does not carry the digest of the script
    and its inputs (changed rules, reboot). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
{%- set c = d.conf %}
{%- if d.has.firewall %}
{%- set ssh = d.vms.values() | map(attribute='ssh_reverse_proxy_port') | map('string') | list %}
{%- set snmp = d.vms.values() | map(attribute='snmp_reverse_proxy_port') | map('string') | list %}
{%- set dnat = [] %}
{%- for vm in d.vms.values() %}{% do dnat.append(vm.snmp_reverse_proxy_port | string ~ '=' ~ vm.ip) %}{% endfor %}
{%- set script = '/etc/mccloud/firewall.sh' %}
{#- Installed by the node's deploy; left out of a job that only re-renders
    the node for its VMs (node_packages false: see reverse_proxy.sls). #}
{%- set packages = d.get('node_packages', true) %}
{%- if packages %}
mccloud-firewall-pkg:
  pkg.installed:
    - failhard: true
    - name: iptables
{%- endif %}

mccloud-firewall-script:
  file.managed:
    - failhard: true
    - name: {{ script }}
    - makedirs: true
    - mode: '0755'
    - contents: |
        #!/bin/sh
        # Managed by mccloud: the reverse-proxy firewall chain of this compute
        # node. Inputs, from the environment: MCCLOUD_CHAIN (the chain),
        # MCCLOUD_TCP_PORTS and MCCLOUD_UDP_PORTS (comma-separated port
        # numbers), MCCLOUD_SNMP_DNAT (comma-separated PORT=IP: udp PORT is
        # forwarded to IP:161). "firewall.sh check" succeeds when the chains
        # already hold these rules; "firewall.sh" rebuilds them.
        set -eu
        C=$MCCLOUD_CHAIN
        for list in "$MCCLOUD_TCP_PORTS" "$MCCLOUD_UDP_PORTS"; do
            case "$list" in
                *[!0-9,]*) echo "mccloud firewall: a port list holds something else than port numbers" >&2; exit 2 ;;
            esac
        done
        case "$MCCLOUD_SNMP_DNAT" in
            *[!0-9.,=]*) echo "mccloud firewall: the snmp forwarding list holds something else than PORT=IP pairs" >&2; exit 2 ;;
        esac
        tag="mccloud-$({ cat "$0"; printf '%s\n' "$C" "$MCCLOUD_TCP_PORTS" "$MCCLOUD_UDP_PORTS" "$MCCLOUD_SNMP_DNAT"; } | sha1sum | cut -c1-12)"
        case "$C" in
            ""|*[!A-Za-z0-9_-]*) echo "mccloud firewall: the chain name holds something else than letters, digits, _ and -" >&2; exit 2 ;;
        esac
        accept() {  # accept PROTO PORTS: one rule per 15 ports (multiport's limit)
            rest=$2
            while [ -n "$rest" ]; do
                chunk=${rest%%,*}; rest=${rest#"$chunk"}; rest=${rest#,}; n=1
                while [ -n "$rest" ] && [ $n -lt 15 ]; do
                    port=${rest%%,*}; rest=${rest#"$port"}; rest=${rest#,}
                    [ -z "$port" ] || { chunk="$chunk,$port"; n=$((n + 1)); }
                done
                [ -z "$chunk" ] || printf -- '-A %s -p %s -m multiport --dports %s -j ACCEPT\n' "$C" "$1" "$chunk"
            done
        }
        if [ "${1:-}" = check ]; then
            # Up to date when both chains carry the digest and every rule:
            # each DNAT of a VM, as many accept rules as written.
            filter=$(iptables -S "$C" 2>/dev/null) && nat=$(iptables -t nat -S "$C" 2>/dev/null) || exit 1
            printf '%s\n' "$filter" | grep -qF -e "$tag" && printf '%s\n' "$nat" | grep -qF -e "$tag" || exit 1
            want=0
            for pair in $(printf '%s\n' "$MCCLOUD_SNMP_DNAT" | tr ',' ' '); do
                want=$((want + 1))
                printf '%s\n' "$nat" | grep -qF -e "--dport ${pair%%=*} -j DNAT --to-destination ${pair#*=}:161" || exit 1
            done
            [ "$(printf '%s\n' "$nat" | grep -c -e '-j DNAT')" -eq "$want" ] || exit 1
            accepts=$({ accept tcp "$MCCLOUD_TCP_PORTS"; accept udp "$MCCLOUD_UDP_PORTS"; } | grep -c -e '-j ACCEPT')
            [ "$(printf '%s\n' "$filter" | grep -c -e '-j ACCEPT')" -eq "$accepts" ] || exit 1
            exit 0
        fi
        # Both chains are written by one iptables-restore (each rule by its
        # own iptables process took seconds for a thousand VMs); --noflush
        # leaves every other chain as it is and empties only these two.
        {
            printf '*filter\n:%s - [0:0]\n' "$C"
            accept tcp "$MCCLOUD_TCP_PORTS"
            accept udp "$MCCLOUD_UDP_PORTS"
            printf -- '-A %s -m comment --comment %s -j RETURN\nCOMMIT\n' "$C" "$tag"
            printf '*nat\n:%s - [0:0]\n' "$C"
            for pair in $(printf '%s\n' "$MCCLOUD_SNMP_DNAT" | tr ',' ' '); do
                printf -- '-A %s -p udp --dport %s -j DNAT --to-destination %s:161\n' "$C" "${pair%%=*}" "${pair#*=}"
            done
            printf -- '-A %s -m comment --comment %s -j RETURN\nCOMMIT\n' "$C" "$tag"
        } | iptables-restore --noflush
        iptables -C INPUT -j "$C" 2>/dev/null || iptables -I INPUT -j "$C"
        iptables -t nat -C PREROUTING -j "$C" 2>/dev/null || iptables -t nat -I PREROUTING -j "$C"
        iptables -t nat -C OUTPUT -m addrtype --dst-type LOCAL -j "$C" 2>/dev/null ||
            iptables -t nat -I OUTPUT -m addrtype --dst-type LOCAL -j "$C"
mccloud-firewall-apply:
  cmd.run:
    - failhard: true
    - name: |
        if /etc/mccloud/firewall.sh check; then echo "changed=no comment='firewall chain up to date'"; exit 0; fi
        /etc/mccloud/firewall.sh || exit $?
        echo "changed=yes comment='firewall chain rewritten'"
    # What a test run (drift) answers: the chains hold every rule, or not.
    - stateful:
      - test_name: |
          if /etc/mccloud/firewall.sh check; then echo "changed=no comment='firewall chain up to date'"
          else echo "changed=yes comment='the firewall chain differs from what the registry renders'"; fi
    - env:
        MCCLOUD_CHAIN: {{ c.firewall_chain | string | tojson }}
        MCCLOUD_TCP_PORTS: {{ ([c.http_port | string, c.https_port | string] + ssh) | join(',') | tojson }}
        MCCLOUD_UDP_PORTS: {{ snmp | join(',') | tojson }}
        MCCLOUD_SNMP_DNAT: {{ dnat | join(',') | tojson }}
    - require:
{%- if packages %}
      - pkg: mccloud-firewall-pkg
{%- endif %}
      - file: mccloud-firewall-script
{%- else %}

mccloud-firewall-disabled:
  test.nop:
    - failhard: true
    - name: makina-states.cloud.compute_node.has.firewall is false
{%- endif %}
