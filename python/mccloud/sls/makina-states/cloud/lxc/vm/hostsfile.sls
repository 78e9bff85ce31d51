{#- Historical name (makina-states): on a devhost, it pointed the VM's
    hosts file at its compute node and its extra domains at 127.0.0.1.
    mccloud has no equivalent: VMs resolve through their DNS servers
    (makina-states.cloud.generic.vm.fix_dns). #}
mccloud-lxc-vm-hostsfile:
  test.nop:
    - name: VMs resolve names through their DNS servers (fix_dns)
