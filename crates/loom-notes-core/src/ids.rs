//! Identifiers: documents get a UUID v4, chunks a UUID v5 derived from `doc_id:index`
//! (reference A.2), so a chunk's id is stable across re-indexing.

use uuid::Uuid;

/// The namespace of chunk point ids.
pub const CHUNK_NAMESPACE: Uuid = Uuid::from_u128(0x6f1c3a2e_9b7d_4e5a_8c0f_2d1e4b6a7c93);

/// A new document id (UUID v4, hyphenated lower case).
pub fn new_doc_id() -> String {
    Uuid::new_v4().to_string()
}

/// The id of chunk `index` of `doc_id`: `uuid5(CHUNK_NAMESPACE, "{doc_id}:{index}")`.
pub fn chunk_point_id(doc_id: &str, index: usize) -> String {
    Uuid::new_v5(&CHUNK_NAMESPACE, format!("{doc_id}:{index}").as_bytes()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_ids_match_python_uuid5() {
        let doc = "e60a4b3e-77a6-49cc-9e12-0e39c80bfd98";
        assert_eq!(
            chunk_point_id(doc, 0),
            "260b2f41-aef1-5fcc-9f88-4694430f9b6e"
        );
        assert_eq!(
            chunk_point_id(doc, 1),
            "444ada0c-a2b4-5399-80a0-7adbdb6c8d22"
        );
    }

    #[test]
    fn doc_ids_are_v4() {
        let id = new_doc_id();
        let parsed = Uuid::parse_str(&id).expect("a uuid");
        assert_eq!(parsed.get_version_num(), 4);
        assert_ne!(id, new_doc_id());
    }
}
