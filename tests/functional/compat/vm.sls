{#- Written for makina-states' data contracts (inside a VM): what its SLS
    read from the registry its compute node wrote into it. #}
{%- set reg = salt['mc_cloud_vm.vm_settings']() %}
{%- set vm = reg.vtVmData %}
compat-vm:
  test.show_notification:
    - text: "{{ reg.mccloud_vmname }} on {{ reg.mccloud_targetname }} ssh port {{ reg.mccloud_vm_ssh_port }} devhost={{ reg.isdevhost }} prefix={{ reg.cloudSettings.prefix }} {{ reg.cnSettings.virt_types | join(',') }}"

compat-vm-data:
  test.show_notification:
    - text: "{{ vm.name }} {{ vm.ip }} {{ vm.mac }} {{ vm.gateway }} {{ vm.netmask }} {{ vm.domains | join(',') }} {{ vm.dnsservers | join(',') }} {{ vm.master }}:{{ vm.master_port }} {{ vm.mode }}"

{#- As makina-states' cloud/lxc/vm/initial_setup.sls reads it. #}
compat-vm-initial-password:
  test.show_notification:
    - text: "root:{{ vm.password }}"

compat-vm-settings-alias:
  test.show_notification:
    - text: "{{ salt['mc_cloud_vm.settings']().mccloud_vmname }} is_vm={{ salt['mc_cloud.is_vm']() }}"
