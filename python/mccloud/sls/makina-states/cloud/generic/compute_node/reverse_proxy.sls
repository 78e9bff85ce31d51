{#- haproxy: http/https by domain and one tcp listen per VM ssh port. The
    configuration is rendered by the registry (pillar mccloud:reverse_proxies)
    and must pass `haproxy -c` before it replaces the current one. Commands
    receive data through their environment only. #}
{%- set d = pillar['mccloud'] %}
{%- set c = d.conf %}
{%- set cert = d.reverse_proxies.ssl_cert %}
mccloud-haproxy-pkg:
  pkg.installed:
    - name: haproxy

mccloud-haproxy-cert-dir:
  file.directory:
    - name: {{ salt['file.dirname'](cert) | tojson }}
    - makedirs: true
    - mode: '0700'

mccloud-haproxy-cert:
  cmd.run:
    - name: |
        set -e
        umask 077
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=$MCCLOUD_CN" \
            -keyout "$MCCLOUD_CERT.key" -out "$MCCLOUD_CERT.crt" 2>/dev/null
        cat -- "$MCCLOUD_CERT.crt" "$MCCLOUD_CERT.key" > "$MCCLOUD_CERT"
        chmod 600 -- "$MCCLOUD_CERT"
        rm -f -- "$MCCLOUD_CERT.key" "$MCCLOUD_CERT.crt"
    - creates: {{ cert | tojson }}
    - env:
        MCCLOUD_CERT: {{ cert | string | tojson }}
        MCCLOUD_CN: {{ d.target | string | tojson }}
    - require:
      - file: mccloud-haproxy-cert-dir

mccloud-haproxy-config:
  file.managed:
    - name: {{ c.haproxy_config | tojson }}
    - contents_pillar: mccloud:reverse_proxies:haproxy_cfg
    - makedirs: true
    - mode: '0644'
    - check_cmd: haproxy -q -c -f
    - require:
      - pkg: mccloud-haproxy-pkg
      - cmd: mccloud-haproxy-cert
{%- if c.get('haproxy_pidfile') %}
{#- Standalone mode: an haproxy of our own on this configuration file
    (several reverse proxies on one host, tests). #}

mccloud-haproxy-standalone-start:
  cmd.run:
    - name: haproxy -D -f "$MCCLOUD_HAPROXY_CONFIG" -p "$MCCLOUD_HAPROXY_PIDFILE"
    - unless: test -s "$MCCLOUD_HAPROXY_PIDFILE" && kill -0 $(cat -- "$MCCLOUD_HAPROXY_PIDFILE") 2>/dev/null
    - env:
        MCCLOUD_HAPROXY_CONFIG: {{ c.haproxy_config | string | tojson }}
        MCCLOUD_HAPROXY_PIDFILE: {{ c.haproxy_pidfile | string | tojson }}
    - require:
      - file: mccloud-haproxy-config

mccloud-haproxy-standalone-reload:
  cmd.run:
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
    - name: haproxy
    - enable: true
    - reload: true
    - watch:
      - file: mccloud-haproxy-config
{%- endif %}
