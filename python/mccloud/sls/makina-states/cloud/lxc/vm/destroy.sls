{#- Destroy: stop and remove the VM's container. Data: pillar mccloud
    (name, lxc_path). #}
{%- set d = pillar['mccloud'] %}
mccloud-lxc-vm-destroy:
  cmd.run:
    - name: lxc-stop -P {{ d.lxc_path }} -n {{ d.name }} -k >/dev/null 2>&1; lxc-destroy -P {{ d.lxc_path }} -n {{ d.name }}
    - onlyif: test -e {{ d.lxc_path }}/{{ d.name }}/config
