use std::net::Ipv4Addr;

use super::*;

fn ranges() -> (PortRange, PortRange) {
    (
        PortRange {
            kind: "ssh",
            start: 2200,
            end: 2299,
        },
        PortRange {
            kind: "snmp",
            start: 3000,
            end: 3099,
        },
    )
}

fn rules(bridge: Option<&str>) -> Rules {
    let vms = [
        (2201, 3001, Ipv4Addr::new(10, 5, 0, 2)),
        (2203, 3003, Ipv4Addr::new(10, 5, 0, 4)),
    ];
    Rules::new(
        "cn--1.example.net",
        [80, 443],
        vms,
        ranges(),
        "10.5.0.0/16".into(),
        bridge.map(str::to_owned),
    )
}

/// Checks that `xml` is one well-formed element after the declaration and
/// the comment: tags balanced and properly nested, attribute values
/// quoted, no `--` inside the comment, no stray `&` or `<`.
fn well_formed(path: &str, xml: &str) {
    let body = xml
        .strip_prefix("<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<!--")
        .unwrap_or_else(|| panic!("{path}: no declaration and comment first"));
    let (comment, mut rest) = body.split_once("-->").expect("comment closed");
    assert!(!comment.contains("--"), "{path}: comment holds --");
    assert!(comment.contains("Managed by mccloud"), "{path}");
    let mut open: Vec<&str> = vec![];
    while let Some(start) = rest.find('<') {
        let text = &rest[..start];
        assert!(
            !text.contains('&') && !text.contains('>'),
            "{path}: stray character in {text:?}"
        );
        let end = rest[start..].find('>').expect("tag closed") + start;
        let tag = &rest[start + 1..end];
        assert!(!tag.contains('<') && !tag.contains('&'), "{path}: {tag}");
        assert_eq!(
            tag.matches('"').count() % 2,
            0,
            "{path}: unquoted attribute in {tag}"
        );
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                open.pop(),
                Some(name),
                "{path}: </{name}> closes another element"
            );
        } else if !tag.ends_with('/') {
            open.push(tag.split(' ').next().unwrap_or(tag));
        }
        rest = &rest[end + 1..];
        if open.is_empty() {
            break;
        }
    }
    assert!(open.is_empty(), "{path}: unclosed {open:?}");
    assert_eq!(rest.trim(), "", "{path}: text after the root element");
}

#[test]
fn every_file_well_formed_and_marked() {
    for bridge in [Some("lxcbr1"), None] {
        let files = firewalld(&rules(bridge));
        let names: Vec<&str> = files.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "policies/mccloud-egress.xml",
                "policies/mccloud-forwards.xml",
                "policies/mccloud-host.xml",
                "services/mccloud-proxy.xml",
                "zones/mccloud.xml",
            ]
        );
        for (path, xml) in &files {
            well_formed(path, xml);
        }
    }
}

#[test]
fn zone_holds_the_bridge_or_the_network() {
    let with = firewalld(&rules(Some("lxcbr1")));
    assert!(with["zones/mccloud.xml"].contains("<interface name=\"lxcbr1\"/>"));
    assert!(!with["zones/mccloud.xml"].contains("<source"));
    let without = firewalld(&rules(None));
    assert!(without["zones/mccloud.xml"].contains("<source address=\"10.5.0.0/16\"/>"));
    assert!(!without["zones/mccloud.xml"].contains("<interface"));
}

#[test]
fn service_lists_the_accepted_ports() {
    let files = firewalld(&rules(None));
    let ports: Vec<&str> = files["services/mccloud-proxy.xml"]
        .lines()
        .filter(|l| l.contains("<port "))
        .map(str::trim)
        .collect();
    assert_eq!(
        ports,
        [
            "<port protocol=\"tcp\" port=\"80\"/>",
            "<port protocol=\"tcp\" port=\"443\"/>",
            "<port protocol=\"tcp\" port=\"2201\"/>",
            "<port protocol=\"tcp\" port=\"2203\"/>",
            "<port protocol=\"udp\" port=\"3001\"/>",
            "<port protocol=\"udp\" port=\"3003\"/>",
        ]
    );
}

#[test]
fn policies_hold_forwards_refusals_and_masquerade() {
    let files = firewalld(&rules(Some("lxcbr1")));
    let host = &files["policies/mccloud-host.xml"];
    assert!(host.contains("<ingress-zone name=\"ANY\"/>\n  <egress-zone name=\"HOST\"/>"));
    assert!(host.contains("<service name=\"mccloud-proxy\"/>"));
    for family in ["ipv4", "ipv6"] {
        assert!(host.contains(&format!(
            "<rule family=\"{family}\" priority=\"32767\"><port port=\"2200-2299\" protocol=\"tcp\"/><reject type=\"tcp-reset\"/></rule>"
        )));
    }
    assert!(host.contains("<port port=\"3000-3099\" protocol=\"udp\"/><reject/>"));
    let fwd = &files["policies/mccloud-forwards.xml"];
    assert!(fwd.contains("<ingress-zone name=\"ANY\"/>\n  <egress-zone name=\"ANY\"/>"));
    assert!(fwd.contains(
        "<forward-port port=\"3001\" protocol=\"udp\" to-port=\"161\" to-addr=\"10.5.0.2\"/>"
    ));
    assert!(fwd.contains(
        "<forward-port port=\"3003\" protocol=\"udp\" to-port=\"161\" to-addr=\"10.5.0.4\"/>"
    ));
    let egress = &files["policies/mccloud-egress.xml"];
    assert!(egress.contains("<policy target=\"ACCEPT\" priority=\"-100\">"));
    assert!(egress.contains("<ingress-zone name=\"mccloud\"/>\n  <egress-zone name=\"ANY\"/>"));
    assert!(egress.contains("<masquerade/>"));
}

#[test]
fn a_node_without_vms_still_refuses_its_ranges() {
    let (ssh, snmp) = (
        PortRange {
            kind: "ssh",
            start: 2200,
            end: 2200,
        },
        PortRange {
            kind: "snmp",
            start: 3000,
            end: 3001,
        },
    );
    let r = Rules::new(
        "cn1",
        [80, 443],
        [],
        (ssh, snmp),
        "10.5.0.0/16".into(),
        None,
    );
    let files = firewalld(&r);
    assert!(!files["policies/mccloud-forwards.xml"].contains("<forward-port"));
    assert!(files["policies/mccloud-host.xml"].contains("<port port=\"2200\" protocol=\"tcp\"/>"));
    assert!(
        files["policies/mccloud-host.xml"].contains("<port port=\"3000-3001\" protocol=\"udp\"/>")
    );
    for (path, xml) in &files {
        well_formed(path, xml);
    }
}
