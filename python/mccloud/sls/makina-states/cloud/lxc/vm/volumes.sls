{#- Volumes: the host side of every bind mount of the VM's fstab exists. #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}
{%- set sources = [] %}
{%- for line in d.vm.fstab or [] %}
{%- set src = (line | string).split()[0] if (line | string).split() else '' %}
{%- if src.startswith('/') %}{% do sources.append(src) %}{% endif %}
{%- endfor %}
{%- if sources %}
mccloud-lxc-vm-volume-sources{{ s }}:
  file.directory:
    - failhard: true
    - names: {{ sources | tojson }}
    - makedirs: true
{%- else %}
mccloud-lxc-vm-no-volumes{{ s }}:
  test.nop:
    - failhard: true
    - name: {{ ('no bind mounts declared for ' ~ d.vm.name) | tojson }}
{%- endif %}
{%- endfor %}
