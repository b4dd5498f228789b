//! Which IP addresses are public: the check behind `fetch_page`'s `public-address` rule.
//!
//! Written out by hand (the standard library's `is_global` is unstable) from the IANA special
//! purpose registries. IPv6 is public only inside global unicast `2000::/3`, minus its special
//! blocks; addresses that embed an IPv4 address (IPv4-mapped, NAT64, 6to4) are judged by it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The name of the non-public range `ip` belongs to (`"loopback"`, `"private"`, ...), or `None`
/// when the address is public.
pub fn non_public_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_range(v4),
        IpAddr::V6(v6) => v6_range(v6),
    }
}

fn v4_range(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    let range = match (a, b, c) {
        _ if ip.is_unspecified() => "unspecified (0.0.0.0)",
        _ if ip.is_broadcast() => "broadcast (255.255.255.255)",
        (0, _, _) => "\"this network\" (0.0.0.0/8)",
        (10, _, _) => "private (10.0.0.0/8)",
        (100, 64..=127, _) => "shared address space, CGNAT (100.64.0.0/10)",
        (127, _, _) => "loopback (127.0.0.0/8)",
        (169, 254, _) => "link-local (169.254.0.0/16)",
        (172, 16..=31, _) => "private (172.16.0.0/12)",
        (192, 0, 0) => "IETF protocol assignments (192.0.0.0/24)",
        (192, 0, 2) => "documentation (192.0.2.0/24)",
        (192, 88, 99) => "6to4 relay anycast (192.88.99.0/24)",
        (192, 168, _) => "private (192.168.0.0/16)",
        (198, 18..=19, _) => "benchmarking (198.18.0.0/15)",
        (198, 51, 100) => "documentation (198.51.100.0/24)",
        (203, 0, 113) => "documentation (203.0.113.0/24)",
        (224..=239, _, _) => "multicast (224.0.0.0/4)",
        (240..=255, _, _) => "reserved (240.0.0.0/4)",
        _ => return None,
    };
    Some(range)
}

fn v6_range(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some("unspecified (::)");
    }
    if ip.is_loopback() {
        return Some("loopback (::1)");
    }
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_range(v4).map(|_| "IPv4-mapped address of a non-public IPv4 address");
    }
    // NAT64 (64:ff9b::/96) carries the IPv4 address in its last 32 bits.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return v4_range(embedded_v4(s[6], s[7]))
            .map(|_| "NAT64 address of a non-public IPv4 address");
    }
    // 6to4 (2002::/16) carries it in bits 16..48.
    if s[0] == 0x2002 {
        return v4_range(embedded_v4(s[1], s[2]))
            .map(|_| "6to4 address of a non-public IPv4 address");
    }
    let range = match s[0] {
        0xff00..=0xffff => "multicast (ff00::/8)",
        0xfe80..=0xfebf => "link-local (fe80::/10)",
        0xfec0..=0xfeff => "site-local (fec0::/10)",
        0xfc00..=0xfdff => "unique local (fc00::/7)",
        0x2001 if s[1] == 0x0db8 => "documentation (2001:db8::/32)",
        0x2001 if s[1] < 0x0200 => "IETF protocol assignments (2001::/23)",
        0x3fff if s[1] < 0x1000 => "documentation (3fff::/20)",
        0x5f00 => "segment routing (5f00::/16)",
        0x2000..=0x3fff => return None,
        0x0064 if s[1] == 0xff9b && s[2] == 1 => "local-use NAT64 (64:ff9b:1::/48)",
        0x0100 if s[1..4] == [0, 0, 0] => "discard-only (100::/64)",
        _ => "reserved (outside global unicast 2000::/3)",
    };
    Some(range)
}

fn embedded_v4(high: u16, low: u16) -> Ipv4Addr {
    let [a, b] = high.to_be_bytes();
    let [c, d] = low.to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(text: &str) -> bool {
        non_public_range(text.parse().unwrap()).is_none()
    }

    #[test]
    fn ipv4_ranges() {
        for refused in [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.5",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.255.0.1",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            assert!(!public(refused), "{refused} should be refused");
        }
        for allowed in [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "93.184.215.14",
        ] {
            assert!(public(allowed), "{allowed} should be public");
        }
    }

    #[test]
    fn ipv6_ranges() {
        for refused in [
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.5",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "2001::1",
            "3fff::1",
            "::127.0.0.1",
            "100::1",
        ] {
            assert!(!public(refused), "{refused} should be refused");
        }
        for allowed in [
            "2606:4700:4700::1111",
            "2a00:1450:4007:80c::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(public(allowed), "{allowed} should be public");
        }
    }
}
