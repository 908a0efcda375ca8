//! The address ranges a webhook delivery never dials, each with the reason it is denied.
//!
//! Why a deny list of special-purpose ranges rather than an allow list of our own networks? The
//! sender must not reach anything that is not the public Internet, and what is internal differs
//! between deployments; the special-purpose registries (RFC 6890 and its IPv6 successors) name
//! every range that is private, local, reserved or an alias of another address, wherever we run.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// One denied range and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeniedRange {
    pub net: IpNet,
    pub reason: &'static str,
}

const fn v4(octets: [u8; 4], prefix_len: u8, reason: &'static str) -> DeniedRange {
    let [a, b, c, d] = octets;
    DeniedRange {
        net: IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix_len)),
        reason,
    }
}

const fn v6(segments: [u16; 8], prefix_len: u8, reason: &'static str) -> DeniedRange {
    let [a, b, c, d, e, f, g, h] = segments;
    DeniedRange {
        net: IpNet::V6(Ipv6Net::new_assert(
            Ipv6Addr::new(a, b, c, d, e, f, g, h),
            prefix_len,
        )),
        reason,
    }
}

/// Searched in order, so a narrower range comes before a wider one that contains it and its
/// more precise reason is the one reported.
///
/// IPv4-mapped IPv6 addresses (`::ffff:0:0/96`) and the well-known NAT64 prefix
/// (`64:ff9b::/96`) are not in the table: they stand for the IPv4 address they embed, and
/// [`denied_range`] judges that address by the IPv4 rows.
#[rustfmt::skip] // one aligned row per range: it is read as a table
pub(crate) static DENY_LIST: [DeniedRange; 30] = [
    v4([0, 0, 0, 0],         8,   "\"this network\"; 0.0.0.0 reaches the local host on many systems (RFC 1122)"),
    v4([10, 0, 0, 0],        8,   "private network (RFC 1918)"),
    v4([100, 64, 0, 0],      10,  "carrier-grade NAT shared space, internal to a provider (RFC 6598)"),
    v4([127, 0, 0, 0],       8,   "loopback: the sender's own host (RFC 1122)"),
    v4([169, 254, 0, 0],     16,  "link-local; cloud metadata services live at 169.254.169.254 (RFC 3927)"),
    v4([172, 16, 0, 0],      12,  "private network (RFC 1918)"),
    v4([192, 0, 0, 0],       24,  "IETF protocol assignments, not global unicast (RFC 6890)"),
    v4([192, 0, 2, 0],       24,  "documentation, TEST-NET-1 (RFC 5737)"),
    v4([192, 88, 99, 0],     24,  "6to4 relay anycast, deprecated (RFC 7526)"),
    v4([192, 168, 0, 0],     16,  "private network (RFC 1918)"),
    v4([198, 18, 0, 0],      15,  "network benchmarking, used inside labs (RFC 2544)"),
    v4([198, 51, 100, 0],    24,  "documentation, TEST-NET-2 (RFC 5737)"),
    v4([203, 0, 113, 0],     24,  "documentation, TEST-NET-3 (RFC 5737)"),
    v4([224, 0, 0, 0],       4,   "multicast: not one recipient (RFC 5771)"),
    v4([255, 255, 255, 255], 32,  "limited broadcast: every host on the local link (RFC 919)"),
    v4([240, 0, 0, 0],       4,   "reserved for future use (RFC 1112)"),
    v6([0, 0, 0, 0, 0, 0, 0, 0],          128, "unspecified address; reaches the local host on many systems (RFC 4291)"),
    v6([0, 0, 0, 0, 0, 0, 0, 1],          128, "loopback: the sender's own host (RFC 4291)"),
    v6([0, 0, 0, 0, 0, 0, 0, 0],          96,  "IPv4-compatible, deprecated: an IPv4 address by another name (RFC 4291)"),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0],  48,  "local-use NAT64, internal to a network (RFC 8215)"),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0],      64,  "discard-only (RFC 6666)"),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0],     32,  "Teredo: tunnels to an embedded IPv4 address (RFC 4380)"),
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32,  "documentation (RFC 3849)"),
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0],     16,  "6to4: tunnels to an embedded IPv4 address (RFC 3056)"),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0],     20,  "documentation (RFC 9637)"),
    v6([0x5f00, 0, 0, 0, 0, 0, 0, 0],     16,  "SRv6 segment identifiers, internal to a network (RFC 9602)"),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0],     7,   "unique local addresses, the IPv6 private networks (RFC 4193)"),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0],     10,  "link-local (RFC 4291)"),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0],     10,  "site-local, deprecated, private where still used (RFC 3879)"),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0],     8,   "multicast: not one recipient (RFC 4291)"),
];

/// The well-known NAT64 prefix (RFC 6052): `64:ff9b::a.b.c.d` reaches `a.b.c.d` through the
/// network's translator.
const NAT64: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96);

/// The denied range `ip` falls in, or `None` when a delivery may dial it.
///
/// A NAT64 address is judged by the IPv4 address it embeds, as an IPv4-mapped one is: an
/// IPv6-only cluster behind DNS64 reaches every IPv4 recipient that way, so denying the prefix
/// whole would cut those recipients off, and what it reaches is exactly the embedded address.
pub fn denied_range(ip: IpAddr) -> Option<&'static DeniedRange> {
    if let IpAddr::V6(v6) = ip {
        let nat64 = || {
            let [.., a, b, c, d] = v6.octets();
            NAT64.contains(&v6).then_some(Ipv4Addr::new(a, b, c, d))
        };
        let embedded = v6.to_ipv4_mapped().or_else(nat64);
        if let Some(v4) = embedded {
            return denied_range(IpAddr::V4(v4));
        }
    }
    DENY_LIST.iter().find(|range| range.net.contains(&ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn to_bits(ip: IpAddr) -> u128 {
        match ip {
            IpAddr::V4(v4) => u32::from(v4).into(),
            IpAddr::V6(v6) => v6.into(),
        }
    }

    fn from_bits(like: IpAddr, bits: u128) -> Option<IpAddr> {
        match like {
            IpAddr::V4(_) => u32::try_from(bits)
                .ok()
                .map(|bits| Ipv4Addr::from(bits).into()),
            IpAddr::V6(_) => Some(Ipv6Addr::from(bits).into()),
        }
    }

    fn first_middle_last(net: IpNet) -> [IpAddr; 3] {
        let (first, last) = (net.network(), net.broadcast());
        let middle =
            from_bits(first, to_bits(first) + (to_bits(last) - to_bits(first)) / 2).unwrap();
        [first, middle, last]
    }

    #[test]
    fn every_range_denies_its_first_middle_and_last_address() {
        for range in &DENY_LIST {
            for inside in first_middle_last(range.net) {
                assert!(denied_range(inside).is_some(), "{inside} in {}", range.net);
            }
        }
    }

    #[test]
    fn the_addresses_next_to_each_range_are_not_in_it() {
        for range in &DENY_LIST {
            let (first, last) = (range.net.network(), range.net.broadcast());
            let before = to_bits(first)
                .checked_sub(1)
                .and_then(|bits| from_bits(first, bits));
            let after = to_bits(last)
                .checked_add(1)
                .and_then(|bits| from_bits(last, bits));
            for outside in before.into_iter().chain(after) {
                assert_ne!(
                    denied_range(outside).map(|denied| denied.net),
                    Some(range.net),
                    "{outside} next to {}",
                    range.net
                );
            }
        }
    }

    #[test]
    fn the_table_is_written_with_network_addresses() {
        for range in &DENY_LIST {
            assert_eq!(
                range.net,
                range.net.trunc(),
                "{} has host bits set",
                range.net
            );
        }
    }

    #[test]
    fn well_known_internal_addresses_are_denied() {
        for denied in [
            "0.0.0.0",
            "10.1.2.3",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.170",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.251",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b:1::1",
            "100::1",
            "2001::1",
            "2001:db8::1",
            "2002:7f00:1::",
            "3fff::1",
            "5f00::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(denied_range(ip(denied)).is_some(), "{denied}");
        }
    }

    #[test]
    fn public_addresses_are_allowed() {
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "2a00:1450::1",
            "64:ff9b::101:101",
            "64:ff9b::808:808",
        ] {
            assert_eq!(denied_range(ip(public)), None, "{public}");
        }
    }

    #[test]
    fn ipv4_mapped_addresses_are_judged_by_the_ipv4_they_embed() {
        for range in &DENY_LIST {
            let IpNet::V4(net) = range.net else { continue };
            for inside in [net.network(), net.broadcast()] {
                let mapped = IpAddr::V6(inside.to_ipv6_mapped());
                let denied_as_ipv4 = denied_range(inside.into());
                assert!(denied_as_ipv4.is_some(), "{inside}");
                assert_eq!(denied_range(mapped), denied_as_ipv4, "{mapped}");
            }
        }
        assert_eq!(
            denied_range(ip("::ffff:127.0.0.1")).map(|denied| denied.net),
            Some(DENY_LIST[3].net)
        );
        assert_eq!(denied_range(ip("::ffff:1.1.1.1")), None);
    }

    #[test]
    fn nat64_addresses_are_judged_by_the_ipv4_they_embed() {
        for range in &DENY_LIST {
            let IpNet::V4(net) = range.net else { continue };
            for inside in [net.network(), net.broadcast()] {
                let nat64 = IpAddr::V6(Ipv6Addr::from_bits(
                    NAT64.network().to_bits() | u128::from(inside.to_bits()),
                ));
                assert_eq!(denied_range(nat64), denied_range(inside.into()), "{nat64}");
            }
        }
        assert_eq!(
            denied_range(ip("64:ff9b::a9fe:a9fe")).map(|denied| denied.net),
            Some(DENY_LIST[4].net),
            "169.254.169.254"
        );
        assert_eq!(
            denied_range(ip("64:ff9b::1.1.1.1")),
            None,
            "a public IPv4 recipient through DNS64"
        );
        assert!(
            denied_range(ip("64:ff9b:1::1.1.1.1")).is_some(),
            "local-use NAT64 stays denied"
        );
    }
}
