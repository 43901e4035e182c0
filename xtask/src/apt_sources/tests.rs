use super::*;

const BOOKWORM_DEB822: &str = "\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

#[test]
fn deb822_stanzas_are_parsed() {
    let e = parse_deb822(BOOKWORM_DEB822);
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].suites, ["bookworm", "bookworm-updates"]);
    assert_eq!(e[0].components, ["main"]);
    assert_eq!(e[1].uris, ["http://deb.debian.org/debian-security"]);
    assert!(!component_enabled(&e, "bookworm", "non-free"));
}

#[test]
fn disabled_stanzas_and_non_free_firmware_do_not_count() {
    let text = "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n\
                Components: main non-free-firmware\n\n\
                Enabled: no\nTypes: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: non-free\n";
    let e = parse_deb822(text);
    assert_eq!(e.len(), 2);
    assert!(!component_enabled(&e, "bookworm", "non-free"));
    assert!(component_enabled(&e, "bookworm", "non-free-firmware"));
}

#[test]
fn one_line_sources_with_options_and_comments() {
    let text = "# deb http://old main non-free\n\
                deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://deb.debian.org/debian bookworm main contrib non-free # x\n\
                deb-src http://deb.debian.org/debian bookworm main\n\
                deb https://packages.example/apt cloud-sdk-bookworm main\n";
    let e = parse_one_line(text);
    assert_eq!(e.len(), 3);
    assert_eq!(e[0].signed_by.as_deref(), Some("/usr/share/keyrings/k.gpg"));
    assert_eq!(e[0].components, ["main", "contrib", "non-free"]);
    assert!(component_enabled(&e, "bookworm", "non-free"));
    assert!(!component_enabled(&e[1..], "bookworm", "non-free"));
}

#[test]
fn enabling_file_mirrors_the_debian_archives_and_then_counts_as_enabled() {
    let mut e = parse_deb822(BOOKWORM_DEB822);
    e.extend(parse_one_line("deb https://packages.example/apt cloud-sdk-bookworm main\n"));
    let file = stanzas_enabling(&e, "bookworm", &["contrib", "non-free"]);
    let added = parse_deb822(&file);
    assert_eq!(added.len(), 2, "{file}");
    assert_eq!(added[0].uris, ["http://deb.debian.org/debian"]);
    assert_eq!(added[0].suites, ["bookworm", "bookworm-updates"]);
    assert_eq!(added[1].suites, ["bookworm-security"]);
    assert!(added.iter().all(|s| s.components == ["contrib", "non-free"]));
    assert_eq!(added[0].signed_by.as_deref(), Some("/usr/share/keyrings/debian-archive-keyring.gpg"));
    e.extend(added);
    assert!(component_enabled(&e, "bookworm", "non-free"));
    assert!(component_enabled(&e, "bookworm", "contrib"));
}

#[test]
fn enabling_file_adds_only_the_components_an_archive_lacks() {
    let e = parse_one_line("deb http://deb.debian.org/debian bookworm main contrib\n");
    let added = parse_deb822(&stanzas_enabling(&e, "bookworm", &["contrib", "non-free"]));
    assert_eq!(added[0].components, ["non-free"]);
}

#[test]
fn enabling_file_falls_back_to_the_default_archive() {
    let added = parse_deb822(&stanzas_enabling(&[], "bookworm", &["contrib", "non-free"]));
    assert_eq!(added.len(), 1);
    assert!(component_enabled(&added, "bookworm", "non-free"));
    assert!(component_enabled(&added, "bookworm", "contrib"));
}

#[test]
fn inline_signed_by_keys_survive_the_round_trip() {
    let text = "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\n\
                Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n -----END PGP PUBLIC KEY BLOCK-----\n";
    let e = parse_deb822(text);
    let added = parse_deb822(&stanzas_enabling(&e, "bookworm", &["contrib", "non-free"]));
    assert_eq!(added[0].signed_by, e[0].signed_by);
}
