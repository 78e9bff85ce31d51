{#- Template containers (images) on the compute node. An image is built here
    from its lxc template when absent (the debian template debootstraps from
    Debian's mirror); otherwise it is synchronised from the controller by the
    sync_images runner. Data: pillar mccloud:images, mccloud:lxc_path. #}
{%- set d = pillar['mccloud'] %}
{%- set needs = {'debian': ['debootstrap'], 'busybox': ['busybox-static'], 'sshd': ['openssh-server']} %}
{%- for name, img in d.images.items() %}
{%- set template = img.get('template', 'debian') %}
{%- if template == 'debian' %}
{%- set args = '-r ' ~ img.get('release', 'bookworm') ~ (' --packages=' ~ img.packages | join(',') if img.get('packages') else '') %}
{%- else %}
{%- set args = img.get('template_args', '') %}
{%- endif %}
{%- if needs.get(template) %}
mccloud-lxc-image-deps-{{ name }}:
  pkg.installed:
    - pkgs: {{ needs[template] | json }}
{%- endif %}

mccloud-lxc-image-{{ name }}:
  cmd.run:
    - name: lxc-create -P {{ d.lxc_path }} -n {{ name }} -t {{ template }}{{ ' -- ' ~ args if args else '' }}
    - unless: test -e {{ d.lxc_path }}/{{ name }}/config
{%- if needs.get(template) %}
    - require:
      - pkg: mccloud-lxc-image-deps-{{ name }}
{%- endif %}
{%- endfor %}

{%- for name, img in d.images.items() %}

mccloud-lxc-image-version-{{ name }}:
  file.managed:
    - name: {{ d.lxc_path }}/{{ name }}/mccloud-image-version
    - contents: "{{ (img | json | sha256)[:16] }}"
    - replace: false
    - require:
      - cmd: mccloud-lxc-image-{{ name }}
{%- endfor %}
