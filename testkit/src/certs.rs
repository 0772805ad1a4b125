//! TLS material and secrets made at test time for the secured cluster: a
//! CA, a PKCS12 keystore per broker node, client certificates (PEM) for
//! mTLS, a PKCS12 truststore, and random passwords. The files come from
//! scripts/kafka/certs.sh (openssl and keytool), the same text the bash
//! `start_kafka_cluster` runs; nothing secret is ever committed.

use std::io::Read;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const SCRIPT: &str = include_str!("../../scripts/kafka/certs.sh");

/// A random secret: 16 bytes from the kernel, as 32 hex digits (safe in
/// every config syntax a test writes it into).
pub fn secret() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("read /dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The files certs.sh made in one directory.
#[derive(Debug, Clone)]
pub struct Certs {
    dir: PathBuf,
    /// The password of every PKCS12 file.
    pub store_password: String,
}

impl Certs {
    /// Makes, in `dir`: the CA; `NAME.p12` for each `(NAME, addresses)` of
    /// `brokers` (CN=broker, the addresses as IP subjectAltNames); `CN.pem`
    /// and `CN.key` for each of `clients`; `truststore.p12`.
    pub fn generate(
        dir: &Path,
        brokers: &[(String, Vec<Ipv4Addr>)],
        clients: &[&str],
    ) -> Result<Certs, String> {
        let store_password = secret()?;
        let mut specs: Vec<String> = brokers
            .iter()
            .map(|(name, addrs)| {
                let sans: Vec<String> = addrs.iter().map(|a| format!("IP:{a}")).collect();
                format!("broker={name}={}", sans.join(","))
            })
            .collect();
        specs.extend(clients.iter().map(|c| format!("client={c}")));
        let out = Command::new("bash")
            .arg("-c")
            .arg(SCRIPT)
            .arg("certs.sh")
            .arg(dir)
            .arg(&store_password)
            .args(&specs)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("run certs.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "certs.sh failed ({}; openssl and keytool are needed): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Certs {
            dir: dir.to_path_buf(),
            store_password,
        })
    }

    /// The CA certificate (PEM): what every client trusts.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The truststore (PKCS12) holding the CA, for the brokers' JVMs.
    pub fn truststore(&self) -> PathBuf {
        self.dir.join("truststore.p12")
    }

    /// Server `name`'s certificate and key (PEM, the key PKCS#8 and
    /// unencrypted), made as a `brokers` entry of [`Certs::generate`]: for
    /// any TLS server of a test (the registry's, an S3 server's).
    pub fn server(&self, name: &str) -> (PathBuf, PathBuf) {
        self.client(name)
    }

    /// Broker `name`'s keystore (PKCS12).
    pub fn keystore(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.p12"))
    }

    /// Client `cn`'s certificate and key (PEM, the key unencrypted).
    pub fn client(&self, cn: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{cn}.pem")),
            self.dir.join(format!("{cn}.key")),
        )
    }

    /// Makes another client certificate, signed by the same CA.
    pub fn add_client(&self, cn: &str) -> Result<(PathBuf, PathBuf), String> {
        // certs.sh makes a CA each run: sign with this one instead.
        let (pem, key) = self.client(cn);
        let run = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&self.dir)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("run openssl: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "openssl {} failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        let key_s = key.display().to_string();
        let csr = self.dir.join(format!("{cn}.csr")).display().to_string();
        let ext = self.dir.join(format!("{cn}.ext"));
        std::fs::write(
            &ext,
            "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyAgreement\n",
        )
        .map_err(|e| format!("write {}: {e}", ext.display()))?;
        run(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            &key_s,
        ])?;
        run(&[
            "req",
            "-new",
            "-key",
            &key_s,
            "-subj",
            &format!("/CN={cn}"),
            "-out",
            &csr,
        ])?;
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "7",
            "-extfile",
            &ext.display().to_string(),
            "-out",
            &pem.display().to_string(),
        ])?;
        let _ = std::fs::remove_file(&csr);
        let _ = std::fs::remove_file(&ext);
        Ok((pem, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_differ_and_are_hex() {
        let (a, b) = (secret().unwrap(), secret().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
    }

    /// The CA signs every certificate; a broker's names its addresses.
    #[test]
    fn certificates_chain_to_the_ca() {
        let dir = std::env::temp_dir().join(format!("graphsink-certs-{}", secret().unwrap()));
        let brokers = vec![(
            "node1".to_string(),
            vec![Ipv4Addr::new(10, 77, 1, 2), Ipv4Addr::new(10, 77, 100, 1)],
        )];
        let certs = Certs::generate(&dir, &brokers, &["alice"]).expect("certs");
        let (extra, _) = certs.add_client("bob").expect("bob");
        for pem in [certs.client("alice").0, extra] {
            let out = Command::new("openssl")
                .args(["verify", "-CAfile"])
                .arg(certs.ca())
                .arg(&pem)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let out = Command::new("openssl")
            .args(["pkcs12", "-nokeys", "-clcerts", "-in"])
            .arg(certs.keystore("node1"))
            .arg("-passin")
            .arg(format!("pass:{}", certs.store_password))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(certs.truststore().exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
