{#- haproxy: http/https by domain and one tcp listen per VM ssh port. The
    configuration is rendered by the registry (pillar mccloud:reverse_proxies)
    and must pass `haproxy -c` before it replaces the current one. Before
    that, no port haproxy binds may be held by another process: a connection
    opened before the port ranges were reserved (ports.sls) can hold a VM's
    port, and haproxy would then fail to bind it. Commands receive data
    through their environment only. #}
{%- from "makina-states/cloud/generic/job.jinja" import job, job_key with context %}
{%- set d = job %}
{%- set c = d.conf %}
{#- Which ports haproxy binds, and which of them another process holds
    (`ss`, run without a shell; haproxy's own sockets are fine). #}
{%- set ssh_ports = d.vms.values() | map(attribute='ssh_reverse_proxy_port') | map('string') | list %}
{%- set wanted = {} %}
{%- for p in ssh_ports %}{% do wanted.update({p: 'ssh'}) %}{% endfor %}
{%- for p in [c.http_port, c.https_port] %}{% do wanted.update({p | string: 'web'}) %}{% endfor %}
{%- set bind = (c.get('bind_address') or '*') | string %}
{%- set wildcards = ['*', '0.0.0.0', '::', ''] %}
{%- set held = {} %}
{%- if not salt['cmd.which']('ss') %}
{%- do held.update({'': 'cannot tell which process holds the ports haproxy binds: ss is missing (install iproute2), then deploy again'}) %}
{%- else %}
{%- set sockets = salt['cmd.run_all'](['ss', '-Htanp'], python_shell=False, ignore_retcode=True, output_loglevel='quiet') %}
{%- if sockets.retcode != 0 %}
{%- do held.update({'': 'cannot tell which process holds the ports haproxy binds: ss -Htanp failed (' ~ sockets.stderr ~ ')'}) %}
{%- endif %}
{%- for line in sockets.stdout.splitlines() if sockets.retcode == 0 %}
{%- set f = line.split() %}
{%- if f | length >= 5 and ':' in f[3] %}
{%- set port = f[3].rsplit(':', 1)[1] %}
{%- set addr = f[3].rsplit(':', 1)[0].strip('[]').split('%')[0] %}
{%- set addr = addr[7:] if addr.startswith('::ffff:') else addr %}
{%- if port in wanted and port not in held and (bind in wildcards or addr in wildcards or addr == bind) %}
{%- set procs = [] %}
{%- if 'users:((' in line %}
{%- for u in line.split('users:((', 1)[1].rstrip().rstrip(')').split('),(') %}
{%- set name = u.split(',pid=', 1)[0].strip('"') %}
{%- set pid = u.split('pid=', 1)[1].split(',', 1)[0] if 'pid=' in u else '?' %}
{%- if name != 'haproxy' %}{% do procs.append(name ~ ' (pid ' ~ pid ~ ')') %}{% endif %}
{%- endfor %}
{%- elif f[0] == 'LISTEN' %}
{%- do procs.append('a process ss cannot name') %}
{%- endif %}
{%- if procs %}
{%- if wanted[port] == 'ssh' %}
{%- do held.update({port: 'port ' ~ port ~ ' is held by ' ~ procs | unique | join(', ') ~ ', opened before the range was reserved: stop it or wait for it to close, then deploy again'}) %}
{%- else %}
{%- do held.update({port: 'port ' ~ port ~ ' is held by ' ~ procs | unique | join(', ') ~ ', and haproxy must bind it: stop it or choose another port, then deploy again'}) %}
{%- endif %}
{%- endif %}
{%- endif %}
{%- endif %}
{%- endfor %}
{%- endif %}
{#- The package is installed by the node's deploy; a job that only
    re-renders the node for its VMs (a destroy: node_packages false) leaves
    it out, as Salt's first pkg state of a job loads every execution module
    (about 1 s). #}
{%- set packages = d.get('node_packages', true) %}
{%- if packages %}
mccloud-haproxy-pkg:
  pkg.installed:
    - failhard: true
    - name: haproxy
{%- endif %}

mccloud-haproxy-ports-free:
  test.configurable_test_state:
    - failhard: true
    - name: the ports haproxy binds are free
    - changes: false
    - result: {{ held | length == 0 }}
    - allow_test_mode_failure: true
    - comment: {{ (held | dictsort | map(attribute=1) | join('; ') if held else 'no other process holds a port haproxy binds') | tojson }}

{#- The certificates the https frontend serves by SNI: one file per domain
    (certificate and key, issued by the controller's CA) from pillar
    mccloud:ssl_certs, written in one state (mccloud_certs.directory: only
    the files that differ, one filesystem sync, contents never shown). The
    directory holds only these: certificates of domains no longer served
    are removed. The directory must be mccloud's own: one it made (marked
    by its .mccloud-certs file) or an empty one; a directory holding files
    of others (/etc/ssl/certs and its CA bundle, say) is refused, never
    emptied nor made private (here, before anything runs, and again by the
    state). #}
{%- set certs_dir = d.reverse_proxies.ssl_certs_dir %}
{%- set own_cert = c.get('ssl_cert') or '' %}
{%- set marker = certs_dir ~ '/.mccloud-certs' %}
{%- set present = salt['file.directory_exists'](certs_dir) %}
{%- set entries = salt['file.readdir'](certs_dir) | reject('in', ['.', '..']) | list if present else [] %}
{%- set foreign = present and entries and not salt['file.file_exists'](marker) %}
{%- if foreign %}
{{- raise('ssl_certs_dir ' ~ certs_dir ~ ' holds files mccloud did not write (' ~ (entries[:3] | join(', '))
          ~ '): mccloud empties it of certificates it no longer serves, so it must be a directory of its own; set '
          ~ 'makina-states.cloud.compute_node.conf.' ~ d.target ~ '.ssl_certs_dir to one, such as /etc/ssl/cloud/certs') }}
{%- endif %}
mccloud-haproxy-certs:
  mccloud_certs.directory:
    - failhard: true
    - name: {{ certs_dir | tojson }}
    - pillar: {{ job_key }}:ssl_certs
    - keep: {{ ([salt['file.basename'](own_cert)] if own_cert and salt['file.dirname'](own_cert) == certs_dir else []) | tojson }}
{%- if packages %}
    - require:
      - pkg: mccloud-haproxy-pkg
{%- endif %}

mccloud-haproxy-config:
  file.managed:
    - failhard: true
    - name: {{ c.haproxy_config | tojson }}
    - contents_pillar: {{ job_key }}:reverse_proxies:haproxy_cfg
    - makedirs: true
    - mode: '0644'
    - check_cmd: haproxy -q -c -f
    - require:
{%- if packages %}
      - pkg: mccloud-haproxy-pkg
{%- endif %}
      - test: mccloud-haproxy-ports-free
      - mccloud_certs: mccloud-haproxy-certs
{%- if c.get('haproxy_pidfile') %}
{#- Standalone mode: an haproxy of our own on this configuration file
    (several reverse proxies on one host, tests). #}

mccloud-haproxy-standalone-start:
  cmd.run:
    - failhard: true
    - name: |
        if test -s "$MCCLOUD_HAPROXY_PIDFILE" && kill -0 $(cat -- "$MCCLOUD_HAPROXY_PIDFILE") 2>/dev/null; then
            echo "changed=no comment='haproxy is running'"; exit 0
        fi
        haproxy -D -f "$MCCLOUD_HAPROXY_CONFIG" -p "$MCCLOUD_HAPROXY_PIDFILE" || exit $?
        echo "changed=yes comment='haproxy started'"
    # What a test run (drift) answers: running, or not.
    - stateful:
      - test_name: |
          if test -s "$MCCLOUD_HAPROXY_PIDFILE" && kill -0 $(cat -- "$MCCLOUD_HAPROXY_PIDFILE") 2>/dev/null; then
              echo "changed=no comment='haproxy is running'"
          else echo "changed=yes comment='haproxy is not running'"; fi
    - env:
        MCCLOUD_HAPROXY_CONFIG: {{ c.haproxy_config | string | tojson }}
        MCCLOUD_HAPROXY_PIDFILE: {{ c.haproxy_pidfile | string | tojson }}
    - require:
      - file: mccloud-haproxy-config

mccloud-haproxy-standalone-reload:
  cmd.run:
    - failhard: true
    - name: haproxy -D -f "$MCCLOUD_HAPROXY_CONFIG" -p "$MCCLOUD_HAPROXY_PIDFILE" -sf $(cat -- "$MCCLOUD_HAPROXY_PIDFILE")
    - env:
        MCCLOUD_HAPROXY_CONFIG: {{ c.haproxy_config | string | tojson }}
        MCCLOUD_HAPROXY_PIDFILE: {{ c.haproxy_pidfile | string | tojson }}
    - onchanges:
      - file: mccloud-haproxy-config
    - require:
      - cmd: mccloud-haproxy-standalone-start
{%- elif c.haproxy_service %}

mccloud-haproxy-service:
  service.running:
    - failhard: true
    - name: haproxy
    - enable: true
    - reload: true
    - watch:
      - file: mccloud-haproxy-config
{%- endif %}
