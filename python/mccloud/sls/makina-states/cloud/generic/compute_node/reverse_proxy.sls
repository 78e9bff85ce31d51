{#- haproxy: http/https by domain and one tcp listen per VM ssh port. The
    configuration is rendered by the registry (pillar mccloud:reverse_proxies)
    and must pass `haproxy -c` before it replaces the current one. #}
{%- set d = pillar['mccloud'] %}
{%- set c = d.conf %}
{%- set cert = d.reverse_proxies.ssl_cert %}
mccloud-haproxy-pkg:
  pkg.installed:
    - name: haproxy

mccloud-haproxy-cert-dir:
  file.directory:
    - name: {{ salt['file.dirname'](cert) }}
    - makedirs: true
    - mode: '0700'

mccloud-haproxy-cert:
  cmd.run:
    - name: >-
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN={{ d.target }}"
        -keyout {{ cert }}.key -out {{ cert }}.crt 2>/dev/null
        && cat {{ cert }}.crt {{ cert }}.key > {{ cert }}
        && chmod 600 {{ cert }} && rm -f {{ cert }}.key {{ cert }}.crt
    - creates: {{ cert }}
    - require:
      - file: mccloud-haproxy-cert-dir

mccloud-haproxy-config:
  file.managed:
    - name: {{ c.haproxy_config }}
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
{%- set pid = c.haproxy_pidfile %}

mccloud-haproxy-standalone-start:
  cmd.run:
    - name: haproxy -D -f {{ c.haproxy_config }} -p {{ pid }}
    - unless: test -s {{ pid }} && kill -0 $(cat {{ pid }}) 2>/dev/null
    - require:
      - file: mccloud-haproxy-config

mccloud-haproxy-standalone-reload:
  cmd.run:
    - name: haproxy -D -f {{ c.haproxy_config }} -p {{ pid }} -sf $(cat {{ pid }})
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
