//! The `HOST:PORT` addresses of the command line that other nodes or etcd
//! are reached at (`--advertise`, `--replica-of`, `--peer`, `--etcd`),
//! checked at start, and host names. A leaf: the settings (config) and the
//! etcd control plane (cluster) both check with it.
//!
//! Unchecked, a typo surfaced much later and far from its cause: an etcd
//! endpoint with port 99999 was dialled on port 80, `--advertise
//! notanaddr` or `0.0.0.0:0` was registered in etcd for every other node
//! to fail to reach, and `--replica-of` naming the node itself made it
//! follow itself forever. Names are not resolved here (DNS may not answer
//! yet at start); only their form is checked.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Letters, digits, `-`, `_` and dots, with no empty label: a host name as
/// the command line and a `Host` header's name are compared with.
pub fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// A `HOST:PORT` split into its host and a port from 1 to 65535; an IPv6
/// host goes in brackets (`[::1]:7700`).
pub(crate) fn host_port(text: &str) -> Result<(&str, u16), &'static str> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (ip, port) = rest
            .split_once("]:")
            .ok_or("expected [IPV6]:PORT after a '['")?;
        ip.parse::<Ipv6Addr>()
            .map_err(|_| "the address in brackets is not an IPv6 address")?;
        (ip, port)
    } else {
        let (host, port) = text.rsplit_once(':').ok_or("expected HOST:PORT")?;
        if host.contains(':') {
            return Err("an IPv6 address goes in brackets: [IPV6]:PORT");
        }
        if host.parse::<IpAddr>().is_err() && !is_host_name(host) {
            return Err("the host is neither an IP address nor a host name");
        }
        (host, port)
    };
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err("the port must be a number from 1 to 65535"),
        Ok(port) => Ok((host, port)),
    }
}

/// `--advertise`: an address other nodes and clients can dial, so a port
/// and a host that is not the unspecified address (`0.0.0.0`, `::`), which
/// names no host to connect to.
pub(crate) fn advertised(text: &str) -> Result<(), &'static str> {
    let (host, _) = host_port(text)?;
    if host.parse::<IpAddr>().is_ok_and(|ip| ip.is_unspecified()) {
        return Err(
            "0.0.0.0 and :: name no host to connect to: give the address others reach this node at",
        );
    }
    Ok(())
}

/// One `--etcd` endpoint: `HOST:PORT`, or `http://HOST:PORT` or
/// `https://HOST:PORT` (as etcd-client takes it, without a path).
pub(crate) fn etcd_endpoint(text: &str) -> Result<(), &'static str> {
    let bare = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
        .unwrap_or(text);
    if bare.contains('/') {
        return Err("expected HOST:PORT, http://HOST:PORT or https://HOST:PORT (no path)");
    }
    host_port(bare).map(drop)
}

/// Whether `target` (a `--replica-of` or `--peer`) names this node: the
/// `--advertise` address, or the address it listens on (`listen`, also
/// reached over loopback when it listens on every address). Names other
/// than `localhost` are not resolved, so this catches the plain mistakes.
pub(crate) fn names_this_node(target: &str, listen: SocketAddr, advertise: Option<&str>) -> bool {
    let parsed = |text: &str| text.parse::<SocketAddr>().ok();
    if let Some(advertise) = advertise {
        if target == advertise || (parsed(target).is_some() && parsed(target) == parsed(advertise))
        {
            return true;
        }
    }
    let Ok((host, port)) = host_port(target) else {
        return false;
    };
    if port != listen.port() {
        return false;
    }
    // A node listening on every address is reached over any loopback
    // address too; one listening on 127.0.0.1 is not this node's neighbour
    // on 127.0.0.2 (two nodes of one host may share a port that way).
    let every = listen.ip().is_unspecified();
    match host.parse::<IpAddr>() {
        Ok(ip) => ip == listen.ip() || (every && (ip.is_loopback() || ip.is_unspecified())),
        Err(_) => host.eq_ignore_ascii_case("localhost") && (every || listen.ip().is_loopback()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_takes_names_addresses_and_ports_in_range() {
        assert_eq!(host_port("127.0.0.1:7700"), Ok(("127.0.0.1", 7700)));
        assert_eq!(host_port("etcd-0.etcd:2379"), Ok(("etcd-0.etcd", 2379)));
        assert_eq!(host_port("[::1]:65535"), Ok(("::1", 65535)));
        for bad in [
            "notanaddr",
            "127.0.0.1:99999",
            "127.0.0.1:0",
            "127.0.0.1:",
            ":7700",
            "::1:7700",
            "[::1]7700",
            "[nope]:1",
            "a b:1",
            "",
        ] {
            assert!(host_port(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_advertised_address_names_a_host() {
        assert_eq!(advertised("10.0.0.5:7700"), Ok(()));
        assert!(advertised("0.0.0.0:0").is_err());
        assert!(advertised("0.0.0.0:7700").is_err());
        assert!(advertised("[::]:7700").is_err());
        assert!(advertised("notanaddr").is_err());
    }

    #[test]
    fn etcd_endpoints_are_bare_or_http_urls() {
        for good in ["127.0.0.1:2379", "http://etcd:2379", "https://[::1]:2379"] {
            assert_eq!(etcd_endpoint(good), Ok(()), "{good}");
        }
        for bad in [
            "127.0.0.1:99999",
            "http://127.0.0.1:99999",
            "http://127.0.0.1",
            "notahost",
            "http://etcd:2379/v3",
            "ftp://etcd:2379",
        ] {
            assert!(etcd_endpoint(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn this_node_is_recognised_by_its_listen_or_advertised_address() {
        let listen: SocketAddr = "127.0.0.1:7700".parse().unwrap();
        assert!(names_this_node("127.0.0.1:7700", listen, None));
        assert!(names_this_node("localhost:7700", listen, None));
        assert!(!names_this_node("127.0.0.1:7710", listen, None));
        assert!(!names_this_node("10.0.0.2:7700", listen, None));
        // Another loopback address with the same port is another node.
        assert!(!names_this_node("127.0.0.2:7700", listen, None));
        let any: SocketAddr = "0.0.0.0:7700".parse().unwrap();
        assert!(names_this_node("127.0.0.1:7700", any, None));
        assert!(!names_this_node("10.0.0.2:7700", any, None));
        let me = Some("node-a.internal:7700");
        assert!(names_this_node("node-a.internal:7700", any, me));
        assert!(!names_this_node("node-b.internal:7700", any, me));
    }
}
