//! Ids as Kafka prints them.

/// Kafka prints ids as 22 characters of URL-safe base64 without padding.
pub fn kafka_style_uuid(id: uuid::Uuid) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = id.as_bytes();
    let mut out = String::with_capacity(22);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &b in bytes {
        acc = (acc << 8) | b as u32;
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_uuid_is_22_chars() {
        let s = kafka_style_uuid(uuid::Uuid::nil());
        assert_eq!(s, "AAAAAAAAAAAAAAAAAAAAAA");
        assert_eq!(kafka_style_uuid(uuid::Uuid::new_v4()).len(), 22);
    }
}
