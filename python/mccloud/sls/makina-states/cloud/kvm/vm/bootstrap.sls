{#- Makes a kvm VM a minion: the generic bootstrap SLS place the minion's
    configuration, keys and bootstrap script into the VM's seed tree; the
    seed is packed again and the guest (re)started when it changed (see
    start.sls): its Salt, installed in the image with units waiting for
    their key, starts the minion at boot. No script runs in the guest from
    the node. Data: the job's (vm, dir, rootfs, seed, domain, minion). #}
include:
  - makina-states.cloud.generic.vm.bootstrap
  - makina-states.cloud.kvm.vm.start
