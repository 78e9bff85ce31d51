{#- Initial setup: root's password from the registry's SHA-512 crypt hash
    (the clear text never reaches a state). An overlayfs clone's upper
    layer holds only what the guest changed: without its own /etc/shadow it
    starts from the template's (rootfs_lower), owner, group and mode kept.
    Written through mccloud_rootfs (never following a link the VM planted).
    Data: the job's (vm, rootfs, rootfs_lower). #}
{%- from "makina-states/cloud/generic/job.jinja" import jobs with context %}
{%- for j in jobs %}
{%- set d, s = j.job, j.sfx %}

mccloud-lxc-vm-root-password{{ s }}:
  mccloud_rootfs.root_password:
    - failhard: true
    - name: /etc/shadow
    - root: {{ d.rootfs | string | tojson }}
    - password_hash: {{ d.vm.password_hash | string | tojson }}
{%- if d.get('rootfs_lower') %}
    - lower: {{ d.rootfs_lower | string | tojson }}
{%- endif %}
{%- endfor %}
