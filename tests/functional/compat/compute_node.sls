{#- Written for makina-states' data contracts (a compute node's side): what
    its SLS read from the registry the controller pushed to the node. #}
{%- set reg = salt['mc_cloud_compute_node.cn_settings']() %}
{%- set data = reg.cnSettings %}
{%- set cloudSettings = reg.cloudSettings %}
compat-node:
  test.show_notification:
    - text: "{{ data.cn.target }} prefix={{ cloudSettings.prefix }} lxc_path={{ reg.lxcSettings.lxc_path }}"
{%- for cert, content in data.cn.ssl_certs %}

compat-node-cert-{{ loop.index }}:
  test.show_notification:
    - text: "/etc/ssl/cloud/certs/{{ cert }}.crt {{ content | length }}"
{%- endfor %}
{%- for vmname, vm in data.cn.vms.items() %}

compat-node-host-{{ vmname }}:
  host.present:
    - ip: {{ vm.ip }}
    - names: {{ vm.domains | tojson }}
{%- endfor %}
{%- for name, img in reg.imgSettings.items() %}

compat-node-image-{{ name }}:
  test.show_notification:
    - text: "{{ name }}"
{%- endfor %}

compat-node-haproxy:
  test.show_notification:
    - text: "{{ data.rp.reverse_proxies.http_proxy.name }} {{ data.rp.reverse_proxies.https_proxy.bind }} {{ data.rp.reverse_proxies.ssh_proxies | length }}"
