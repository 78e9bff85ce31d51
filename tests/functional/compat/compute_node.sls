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
{#- As makina-states' cloud/lxc/compute_node/images.sls reads them. #}
{%- for name, imgdata in reg.imgSettings.items() %}
{%- set arc = '{0}/{1}'.format(name, imgdata['lxc_tarball_name']) %}
{%- set tversion = imgdata['lxc_tarball_ver'] %}

compat-node-image-{{ name }}-{{ tversion }}:
  test.show_notification:
    - text: "{{ name }} {{ arc }} {{ tversion }} {{ imgdata.lxc_tarball }} {{ imgdata.lxc_tarball_md5 }}"
{%- endfor %}

compat-node-haproxy:
  test.show_notification:
    - text: "{{ data.rp.reverse_proxies.http_proxy.name }} {{ data.rp.reverse_proxies.https_proxy.bind }} {{ data.rp.reverse_proxies.ssh_proxies | length }}"
