{#- Reconfigure: apply changed settings to an existing container and restart
    it when its configuration changed. #}
{%- set d = pillar['mccloud'] %}
{%- set v = d.vm %}
include:
  - makina-states.cloud.lxc.vm.config

mccloud-lxc-vm-restart:
  cmd.run:
    - name: >-
        lxc-stop -P {{ d.lxc_path }} -n {{ v.name }} -t 30;
        lxc-start -P {{ d.lxc_path }} -n {{ v.name }} && lxc-wait -P {{ d.lxc_path }} -n {{ v.name }} -s RUNNING -t 60
    - onlyif: lxc-info -P {{ d.lxc_path }} -n {{ v.name }} -s | grep -q RUNNING
    - onchanges:
      - cmd: mccloud-lxc-vm-config
