{#- Spawn: clone the template container (dir; overlayfs as a snapshot) or
    create from the image (*-scratch types), configure it from the registry
    and start it. Running it again on an existing container changes nothing. #}
{%- set d = pillar['mccloud'] %}
{%- set v = d.vm %}
{%- set P = d.lxc_path %}
include:
  - makina-states.cloud.generic.vm.rootfs_guard
  - makina-states.cloud.lxc.vm.config
  - makina-states.cloud.lxc.vm.volumes

mccloud-lxc-vm-create:
  cmd.run:
{%- if v.from_container %}
    - name: >-
        lxc-copy -P {{ P }} -n {{ v.from_container }} -N {{ v.name }}
        {%- if v.backing == 'overlayfs' %} -s -B overlay{% endif %}
        {%- if v.backing == 'lvm' %} -B lvm -L {{ v.size }}{% endif %}
{%- else %}
{%- set img = d.images.get(v.image, {'template': v.image}) %}
    - name: >-
        lxc-create -P {{ P }} -n {{ v.name }} -t {{ img.get('template', 'debian') }}
        {%- if v.backing == 'lvm' %} -B lvm --vgname {{ v.vgname }} --fssize {{ v.size }}
        {%- if v.lvname %} --lvname {{ v.lvname }}{% endif %}{% endif %}
        {%- if img.get('template', 'debian') == 'debian' %} -- -r {{ img.get('release', 'bookworm') }}
        {%- if img.get('packages') %} --packages={{ img.packages | join(',') }}{% endif %}{% endif %}
{%- endif %}
    - unless: test -e {{ P }}/{{ v.name }}/config
    - require_in:
      - cmd: mccloud-lxc-vm-config
      - file: mccloud-lxc-vm-guest-network
      - test: mccloud-vm-rootfs-guard

mccloud-lxc-vm-start:
  cmd.run:
    - name: lxc-start -P {{ P }} -n {{ v.name }} && lxc-wait -P {{ P }} -n {{ v.name }} -s RUNNING -t 60
    - unless: lxc-info -P {{ P }} -n {{ v.name }} -s | grep -q RUNNING
    - require:
      - cmd: mccloud-lxc-vm-config
      - file: mccloud-lxc-vm-guest-network
      - sls: makina-states.cloud.lxc.vm.volumes
