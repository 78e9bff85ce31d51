{#- Written for makina-states' data contracts (the controller side): the
    keys its cloud SLS and sites' states read from the registry. Rendered
    with Salt's StrictUndefined, a missing key fails the render. #}
{%- set cloudSettings = salt['mc_cloud.settings']() %}
{%- set lxcSettings = salt['mc_cloud_lxc.settings']() %}
{%- set imgSettings = salt['mc_cloud_images.settings']() %}
{%- set cnSettings = salt['mc_cloud_compute_node.settings']() %}
{%- set reg = salt['mc_cloud.registry']() %}
compat-controller-layout:
  file.directory:
    - names:
      - {{ cloudSettings.pvdir }}
      - {{ cloudSettings.pfdir }}
      - {{ cloudSettings.root }}/{{ cloudSettings.all_sls_dir }}
      - {{ cloudSettings.root }}/{{ cloudSettings.compute_node_sls_dir }}
      - {{ cloudSettings.root }}/{{ cloudSettings.ssl_dir }}
      - {{ cloudSettings.ssl_pillar_dir }}
      - {{ cloudSettings.compute_node_pillar_dir }}

compat-controller-ca:
  test.show_notification:
    - text: "{{ cloudSettings.ssl.ca.ca_name }} C={{ cloudSettings.ssl.ca.C }} ST={{ cloudSettings.ssl.ca.ST }} L={{ cloudSettings.ssl.ca.L }} O={{ cloudSettings.ssl.ca.O }} OU={{ cloudSettings.ssl.ca.OU }} CN={{ cloudSettings.ssl.ca.CN }} email={{ cloudSettings.ssl.ca.emailAddress }} bits={{ cloudSettings.ssl.ca.bits }} days={{ cloudSettings.ssl.ca.days }} cert_days={{ cloudSettings.ssl.cert_days }}"

compat-controller-boot:
  test.show_notification:
    - text: "{{ cloudSettings.mode }} {{ cloudSettings.master }}:{{ cloudSettings.master_port }} {{ cloudSettings.bootsalt_args }} / {{ cloudSettings.bootsalt_mastersalt_args }} @{{ cloudSettings.bootsalt_branch }} {{ cloudSettings.script }} {{ cloudSettings.prefix }}"

compat-registry:
  test.show_notification:
    - text: "generic={{ reg.is.generic }} lxc={{ reg.is.lxc }} saltify={{ reg.is.saltify }}"
{%- for name, profile in lxcSettings.lxc_cloud_profiles.items() %}

compat-size-profile-{{ name }}:
  test.show_notification:
    - text: "{{ name }}={{ profile.size }}"
{%- endfor %}
{%- if imgSettings.lxc.cron_sync %}

compat-images-cron:
  cron.present:
    - minute: {{ imgSettings.lxc.cron_minute }}
    - hour: {{ imgSettings.lxc.cron_hour }}
    - name: /usr/bin/mastersalt-run -linfo mc_cloud_lxc.sync_images > /dev/null
    - identifier: compat lxc image sync
{%- endif %}
{%- for name, img in imgSettings.lxc.images.items() %}

compat-image-{{ name }}:
  test.show_notification:
    - text: "{{ imgSettings.lxc.images_root }}/{{ name }} from {{ img.source }} version {{ img.version }} checksum {{ img.checksum }} builder {{ img.builder_ref }}"
{%- endfor %}
{%- for target, tdata in cnSettings.targets.items() %}
{%- set t = salt['mc_cloud_compute_node.get_settings_for_target'](target) %}
{%- set rp = t.reverse_proxies %}

compat-target-{{ target }}:
  test.show_notification:
    - text: "{{ t.target }} lxc={{ t.virt_types.lxc }} firewall={{ t.firewall }} {{ t.http_proxy_mode }} {{ t.domains | join(',') }} {{ tdata.virt_types | join(',') }}"
{%- for proxy in [rp.http_proxy, rp.https_proxy] %}

compat-frontend-{{ proxy.name }}:
  test.show_notification:
    - text: "frontend {{ proxy.name }} bind {{ proxy.bind }} mode {{ proxy.mode }} {{ proxy.raw_opts | join('; ') }}"
{%- endfor %}
{%- for kind in ['http_backends', 'https_backends'] %}
{%- for name, backend in rp[kind].items() %}

compat-{{ kind }}-{{ name }}:
  test.show_notification:
    - text: "backend {{ backend.name }} {{ backend.raw_opts | join('; ') }}{% for srv in backend.servers %} server {{ srv.name }} {{ srv.bind }} {{ srv.opts }}{% endfor %}"
{%- endfor %}
{%- endfor %}
{%- for rule in rp.sw_proxies %}

compat-sw-{{ target }}-{{ loop.index }}:
  test.show_notification:
{%- if rule.comment is defined %}
    - text: "# {{ rule.comment }}"
{%- else %}
    - text: "{{ rule.action }} {{ rule.source }} {{ rule.dest }} {{ rule.proto }} {{ rule.dport }}"
{%- endif %}
{%- endfor %}
{%- for cert, content in t.ssl_certs %}

compat-cert-{{ target }}-{{ loop.index }}:
  test.show_notification:
    - text: "{{ cert }} {{ content | length }}"
{%- endfor %}
{%- for vmname, vm in t.vms.items() %}
{%- set vmdata = salt['mc_cloud_' ~ vm.virt_type ~ '.get_settings_for_vm'](target, vmname) %}

compat-vm-{{ vmname }}:
  test.show_notification:
    - text: "{{ vm.vmname }} {{ vm.virt_type }} {{ vm.ip }} {{ vm.domains | join(',') }} {{ vmdata.name }} {{ vmdata.ip }} {{ vmdata.mac }} {{ vmdata.get('size', '-') }} {{ vmdata.profile }} {{ vmdata.backing }} {{ vmdata.snapshot }} {{ vmdata.script_args }} {{ vmdata.ssh_reverse_proxy_port }} {{ vmdata.additional_ips | length }}"
{%- endfor %}
{%- endfor %}
