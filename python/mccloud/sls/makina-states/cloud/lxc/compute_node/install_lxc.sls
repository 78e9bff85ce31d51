{#- LXC on a compute node: Debian packages, subordinate ids, the lxc path;
    the VM network (bridge with the gateway address, IP forwarding, NAT)
    comes from makina-states.cloud.generic.compute_node.vm_network, shared
    with the kvm driver. Data: pillar mccloud (the node's settings from the
    registry). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job %}
include:
  - makina-states.cloud.generic.compute_node.vm_network

mccloud-lxc-pkgs:
  pkg.{{ 'latest' if d.get('upgrade') else 'installed' }}:
    - failhard: true
    - pkgs:
      - lxc
      - iptables
      - rsync
    - require_in:
      - cmd: mccloud-lxc-nat

{#- Unprivileged containers: root may map the blocks of host ids the
    registry hands out (lxc uses newuidmap and newgidmap, which read these
    files, when the uidmap package is installed). root's line covers what
    the node needs (count, from the core: its unprivileged VMs or its
    capacity); it is checked first against the other owners' lines and
    useradd's subordinate ids (/etc/login.defs), and the deploy fails,
    naming the owner and the range, before anything is written. The line
    starting at the range start is root's (replaced when the node grows);
    an operator's other lines are kept. #}
{%- set ids = d.get('idmap_range') or {} %}
{%- if ids %}
{%- for f in ['subuid', 'subgid'] %}

mccloud-lxc-{{ f }}:
  mccloud_subids.root_range:
    - failhard: true
    - name: /etc/{{ f }}
    - start: {{ ids.start | int }}
    - count: {{ ids.get('count', 0) | int }}
    - allow_login_defs_range: {{ ids.get('allow_login_defs_range') is sameas true }}
{%- endfor %}
{%- endif %}

mccloud-lxc-path:
  file.directory:
    - failhard: true
    - name: {{ d.lxc_path | tojson }}
    - makedirs: true
    - mode: '0755'
