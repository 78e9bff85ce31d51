//! A kvm VM's domain: the paths of its files on the node and the QEMU
//! command line that runs it, rendered from its finished settings. Pure:
//! the node's states write and run exactly this (an argument list, never a
//! shell line).

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::drivers::lxc::images::hex;

/// The QEMU binary every domain runs.
pub const QEMU: &str = "qemu-system-x86_64";
/// The kernel command line of every guest (its root is the whole disk,
/// its console the serial port, its first NIC `eth0`).
pub const CMDLINE: &str = "root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet";
/// The guest CPU: everything the accelerator offers (`max`) but the
/// IA32_ARCH_CAPABILITIES MSR, which a nested KVM host refuses to set
/// (QEMU 7.2 then aborts at start: "failed to set MSR 0x10a",
/// `kvm_buf_set_msrs` assertion), so that `kvm` and `kvm:tcg` start where
/// `/dev/kvm` answers from inside another VM; TCG takes the same model.
pub const CPU: &str = "max,-arch-capabilities";
/// Longest network interface name Linux accepts (`IFNAMSIZ` - 1).
pub const IFNAME_MAX: usize = 15;

/// One network interface of a guest: its tap on the node's bridge, the
/// MAC the guest sees, and the IP the registry gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Nic {
    /// The tap device on the node (see [`tap`]).
    pub tap: String,
    /// The guest's MAC (the registry's).
    pub mac: String,
    /// The guest's address on this interface (the registry's).
    pub ip: String,
}

/// What a domain is rendered from: the VM's name and finished kvm
/// settings, and its image's place.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    /// The VM's name.
    pub name: &'a str,
    /// `kvm_path`: the VMs' directories are under `<kvm_path>/vms`.
    pub kvm_path: &'a str,
    /// The kvm images' root (`images.kvm.images_root`).
    pub images_root: &'a str,
    /// The image's name.
    pub image: &'a str,
    /// The image's version (its directory under the image's).
    pub version: &'a str,
    /// `kvm`, `tcg` or `kvm:tcg` (KVM, falling back to TCG).
    pub accel: &'a str,
    /// QEMU machine type (`q35`, `pc`).
    pub machine: &'a str,
    /// Virtual CPUs.
    pub cpus: u64,
    /// Memory, MiB.
    pub memory: u64,
    /// Extra kernel arguments (empty: none).
    pub append: &'a str,
    /// The interfaces as `(mac, ip)`: the main one first, then one per
    /// additional IP.
    pub nics: Vec<(&'a str, &'a str)>,
}

/// A rendered domain (I1's `domain` object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Domain {
    /// The VM's name (QEMU's `-name guest=`).
    pub name: String,
    /// Its directory on the node, `<kvm_path>/vms/<vm>`.
    pub dir: String,
    /// Its disk: a qcow2 overlay of [`Domain::base`].
    pub disk: String,
    /// Its NoCloud seed ISO.
    pub seed: String,
    /// QEMU's pid file.
    pub pidfile: String,
    /// QEMU's QMP socket.
    pub qmp: String,
    /// The serial console's log.
    pub console: String,
    /// The image version's directory, `<images_root>/<image>/<version>`
    /// (its `disk.qcow2`, `vmlinuz` and `initrd.img`).
    pub image_dir: String,
    /// The image's base disk, `<image_dir>/disk.qcow2`: a new disk is made
    /// as an overlay of it.
    pub base: String,
    /// The VM's own copy of its image's kernel, `<dir>/vmlinuz`, made with
    /// its disk: the guest boots the kernel matching its disk's base for
    /// its whole life, whatever image version is declared later.
    pub kernel: String,
    /// The VM's own copy of its image's initrd, `<dir>/initrd.img`.
    pub initrd: String,
    /// Its interfaces.
    pub nics: Vec<Nic>,
    /// The QEMU command line, program first.
    pub argv: Vec<String>,
}

impl Domain {
    /// The domain as a VM's settings carry it.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The tap of interface `index` of VM `vm`: `mck`, 10 hex digits of the
/// SHA-256 of the VM's name, the index (unique per VM and node whatever
/// the name's length, and at most [`IFNAME_MAX`] characters for an index
/// below 100).
pub fn tap(vm: &str, index: usize) -> String {
    let digest = hex(&Sha256::digest(vm.as_bytes()));
    format!("mck{}{index}", digest.get(..10).unwrap_or(&digest))
}

/// `path` as a value of a QEMU option list (`file=…,if=…`): commas doubled.
fn opt(path: &str) -> String {
    path.replace(',', ",,")
}

/// The accelerator options of `accel`: `kvm:tcg` lists both, QEMU using
/// the next one when the first fails to initialise.
fn accels(accel: &str) -> Vec<&str> {
    accel.split(':').filter(|a| !a.is_empty()).collect()
}

/// Renders the domain of `spec`.
pub fn render(spec: &Spec) -> Domain {
    let dir = format!("{}/vms/{}", spec.kvm_path.trim_end_matches('/'), spec.name);
    let image_dir = format!(
        "{}/{}/{}",
        spec.images_root.trim_end_matches('/'),
        spec.image,
        spec.version
    );
    let file = |n: &str| format!("{dir}/{n}");
    let (disk, seed, pidfile, qmp, console) = (
        file("disk.qcow2"),
        file("seed.iso"),
        file("qemu.pid"),
        file("qmp.sock"),
        file("console.log"),
    );
    let base = format!("{image_dir}/disk.qcow2");
    let (kernel, initrd) = (file("vmlinuz"), file("initrd.img"));
    let nics: Vec<Nic> = spec
        .nics
        .iter()
        .enumerate()
        .map(|(i, (mac, ip))| Nic {
            tap: tap(spec.name, i),
            mac: (*mac).to_owned(),
            ip: (*ip).to_owned(),
        })
        .collect();
    let mut cmdline = CMDLINE.to_owned();
    if !spec.append.trim().is_empty() {
        cmdline.push(' ');
        cmdline.push_str(spec.append.trim());
    }
    let mut argv: Vec<String> = vec![
        QEMU.into(),
        "-name".into(),
        format!("guest={}", spec.name),
        "-machine".into(),
        spec.machine.into(),
    ];
    for a in accels(spec.accel) {
        argv.extend(["-accel".into(), a.to_owned()]);
    }
    argv.extend([
        "-cpu".into(),
        CPU.into(),
        "-smp".into(),
        spec.cpus.to_string(),
        "-m".into(),
        spec.memory.to_string(),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-kernel".into(),
        kernel.clone(),
        "-initrd".into(),
        initrd.clone(),
        "-append".into(),
        cmdline,
        "-drive".into(),
        format!("file={},if=virtio,format=qcow2,discard=unmap", opt(&disk)),
        "-drive".into(),
        format!("file={},if=virtio,format=raw,readonly=on", opt(&seed)),
    ]);
    for (i, nic) in nics.iter().enumerate() {
        argv.extend([
            "-netdev".into(),
            format!("tap,id=n{i},ifname={},script=no,downscript=no", nic.tap),
            "-device".into(),
            format!("virtio-net-pci,netdev=n{i},mac={}", nic.mac),
        ]);
    }
    argv.extend([
        "-device".into(),
        "virtio-rng-pci".into(),
        "-serial".into(),
        format!("file:{console}"),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", opt(&qmp)),
        "-pidfile".into(),
        pidfile.clone(),
        "-daemonize".into(),
    ]);
    Domain {
        name: spec.name.to_owned(),
        dir,
        disk,
        seed,
        pidfile,
        qmp,
        console,
        image_dir,
        base,
        kernel,
        initrd,
        nics,
        argv,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(accel: &'a str, nics: Vec<(&'a str, &'a str)>) -> Spec<'a> {
        Spec {
            name: "web1.example.com",
            kvm_path: "/var/lib/mccloud/kvm",
            images_root: "/var/lib/mccloud/kvm/images",
            image: "mccloud-kvm-bookworm",
            version: "0123456789abcdef",
            accel,
            machine: "q35",
            cpus: 1,
            memory: 512,
            append: "",
            nics,
        }
    }

    #[test]
    fn golden_argv() {
        let d = render(&spec("kvm:tcg", vec![("00:16:3e:00:00:01", "10.5.0.2")]));
        let t = tap("web1.example.com", 0);
        let dir = "/var/lib/mccloud/kvm/vms/web1.example.com";
        let img = "/var/lib/mccloud/kvm/images/mccloud-kvm-bookworm/0123456789abcdef";
        let want: Vec<String> = [
            "qemu-system-x86_64",
            "-name",
            "guest=web1.example.com",
            "-machine",
            "q35",
            "-accel",
            "kvm",
            "-accel",
            "tcg",
            "-cpu",
            "max,-arch-capabilities",
            "-smp",
            "1",
            "-m",
            "512",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-kernel",
            &format!("{dir}/vmlinuz"),
            "-initrd",
            &format!("{dir}/initrd.img"),
            "-append",
            "root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet",
            "-drive",
            &format!("file={dir}/disk.qcow2,if=virtio,format=qcow2,discard=unmap"),
            "-drive",
            &format!("file={dir}/seed.iso,if=virtio,format=raw,readonly=on"),
            "-netdev",
            &format!("tap,id=n0,ifname={t},script=no,downscript=no"),
            "-device",
            "virtio-net-pci,netdev=n0,mac=00:16:3e:00:00:01",
            "-device",
            "virtio-rng-pci",
            "-serial",
            &format!("file:{dir}/console.log"),
            "-qmp",
            &format!("unix:{dir}/qmp.sock,server=on,wait=off"),
            "-pidfile",
            &format!("{dir}/qemu.pid"),
            "-daemonize",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        assert_eq!(d.argv, want);
        assert_eq!(d.dir, dir);
        assert_eq!(d.image_dir, img);
        assert_eq!(d.base, format!("{img}/disk.qcow2"));
        assert_eq!(d.kernel, format!("{dir}/vmlinuz"));
        assert_eq!(d.initrd, format!("{dir}/initrd.img"));
        assert_eq!(
            d.nics,
            vec![Nic {
                tap: t,
                mac: "00:16:3e:00:00:01".into(),
                ip: "10.5.0.2".into()
            }]
        );
        let j = d.to_json();
        for k in [
            "name",
            "dir",
            "disk",
            "seed",
            "pidfile",
            "qmp",
            "console",
            "image_dir",
            "base",
            "kernel",
            "initrd",
            "nics",
            "argv",
        ] {
            assert!(j.get(k).is_some(), "{k}");
        }
    }

    #[test]
    fn one_accelerator_option_per_accelerator() {
        let count = |accel| {
            let d = render(&spec(accel, vec![("m", "i")]));
            d.argv
                .windows(2)
                .filter(|w| w[0] == "-accel")
                .map(|w| w[1].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(count("tcg"), ["tcg"]);
        assert_eq!(count("kvm"), ["kvm"]);
        assert_eq!(count("kvm:tcg"), ["kvm", "tcg"]);
    }

    #[test]
    fn additional_ips_are_more_nics_in_order() {
        let d = render(&spec(
            "tcg",
            vec![
                ("00:16:3e:00:00:01", "10.5.0.2"),
                ("00:16:3e:00:00:02", "192.168.9.4"),
            ],
        ));
        assert_eq!(d.nics.len(), 2);
        assert_eq!(d.nics[1].ip, "192.168.9.4");
        assert!(d.nics[1].tap.ends_with('1') && d.nics[0].tap.ends_with('0'));
        assert_ne!(d.nics[0].tap, d.nics[1].tap);
        let i = d
            .argv
            .iter()
            .position(|a| a.starts_with("tap,id=n1,"))
            .unwrap();
        assert_eq!(
            d.argv[i + 2],
            "virtio-net-pci,netdev=n1,mac=00:16:3e:00:00:02"
        );
    }

    #[test]
    fn tap_names_fit_an_interface_name_whatever_the_vm_name() {
        let long = "a-very-long-virtual-machine-name.with.many.labels.example.com";
        for (vm, i) in [("a", 0), (long, 0), (long, 99)] {
            let t = tap(vm, i);
            assert!(t.len() <= IFNAME_MAX, "{t}");
            assert!(t.starts_with("mck") && t.chars().all(|c| c.is_ascii_alphanumeric()));
        }
        assert_ne!(tap("a.example.com", 0), tap("b.example.com", 0));
        assert_eq!(tap("a.example.com", 0), tap("a.example.com", 0));
    }

    #[test]
    fn extra_kernel_arguments_follow_the_fixed_ones_and_commas_are_escaped() {
        let mut s = spec("tcg", vec![("m", "i")]);
        s.append = "systemd.unit=rescue.target";
        s.kvm_path = "/srv/k,v";
        let d = render(&s);
        let i = d.argv.iter().position(|a| a == "-append").unwrap();
        assert_eq!(
            d.argv[i + 1],
            format!("{CMDLINE} systemd.unit=rescue.target")
        );
        assert!(d.argv.iter().any(|a| a.starts_with("file=/srv/k,,v/vms/")));
        assert_eq!(d.disk, "/srv/k,v/vms/web1.example.com/disk.qcow2");
    }
}
