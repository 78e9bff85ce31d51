{#- The compute node's firewall, written by its driver (conf
    firewall_driver: iptables, nftables, firewalld or auto; see
    docs/howto/firewall.md) from the rule model the core renders
    (firewall_rules): accept http/https and every allocated ssh/snmp
    port, refuse the ranges' other ports, forward each VM's snmp port to
    the VM, masquerade and forward the VM network. auto picks firewalld
    when it runs, else nftables when nft is installed, else iptables.
    With firewalld running, the nftables and iptables drivers are refused:
    a reload of firewalld keeps no rule of another table's making, and its
    DROP wins over another table's accept. Whatever the driver, the rules another
    driver of mccloud's wrote before are removed (switching drivers). #}
{%- from "makina-states/cloud/generic/job.jinja" import job, job_key with context %}
{%- set d = job %}
{%- set c = d.conf %}
{%- if d.has.firewall %}
{%- set fw = d.firewall_rules %}
{%- set packages = d.get('node_packages', true) %}
{#- firewalld runs: it says so on its bus, or its nftables table is there
    (a bus that does not answer must not hide it). #}
{%- set firewalld_runs = (salt['cmd.which']('firewall-cmd') and salt['cmd.retcode'](['firewall-cmd', '--state'], python_shell=False, ignore_retcode=True, output_loglevel='quiet') == 0)
                         or (salt['cmd.which']('nft') and salt['cmd.retcode'](['nft', 'list', 'table', 'inet', 'firewalld'], python_shell=False, ignore_retcode=True, output_loglevel='quiet') == 0) %}
{%- set driver = fw.driver %}
{%- if driver == 'auto' %}
{%-   set driver = 'firewalld' if firewalld_runs else ('nftables' if salt['cmd.which']('nft') else 'iptables') %}
{%- endif %}
{%- if driver in ['nftables', 'iptables'] and firewalld_runs %}
{%-   set tcp = fw.iptables.tcp_ports %}
{%-   set udp = fw.iptables.udp_ports %}

mccloud-firewall-coexistence:
  test.configurable_test_state:
    - failhard: true
    - name: firewall driver {{ driver }}
    - result: false
    - changes: false
    - comment: {{ ('firewalld runs on this node: a firewalld reload drops what another table adds, and its '
                   ~ 'DROP wins over the accept of mccloud\'s rules. Set makina-states.cloud.compute_node.conf.'
                   ~ d.target ~ '.firewall_driver to firewalld (or auto); or stop firewalld; or keep ' ~ driver ~ ' '
                   ~ 'and have firewalld accept tcp ports ' ~ (tcp or 'none') ~ ' and udp ports '
                   ~ (udp or 'none') ~ ', forward the snmp ports ' ~ (fw.iptables.snmp_dnat or 'none')
                   ~ ' and masquerade ' ~ d.network.network ~ '/' ~ d.network.netmask) | tojson }}
{%- else %}
{#-   Each driver's template by its literal name: data never names a file
      (the core allows these three; anything else is the default). #}
{%-   if driver == 'nftables' %}
{%-     include "makina-states/cloud/generic/compute_node/firewall_drivers/nftables.jinja" %}
{%-   elif driver == 'firewalld' %}
{%-     include "makina-states/cloud/generic/compute_node/firewall_drivers/firewalld.jinja" %}
{%-   else %}
{%-     set driver = 'iptables' %}
{%-     include "makina-states/cloud/generic/compute_node/firewall_drivers/iptables.jinja" %}
{%-   endif %}
{%-   include "makina-states/cloud/generic/compute_node/firewall_drivers/others.jinja" %}
{%- endif %}
{%- else %}

mccloud-firewall-disabled:
  test.nop:
    - failhard: true
    - name: makina-states.cloud.compute_node.has.firewall is false
{%- endif %}
