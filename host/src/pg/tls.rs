//! TLS for connections to PostgreSQL, with libpq's `sslmode` semantics.
//!
//! Owns the rustls client configuration that a [`ConnInfo`] asks for, the
//! handshake, and the `tls-server-end-point` channel-binding data (RFC 5929)
//! that SCRAM-SHA-256-PLUS needs. It does not send `SSLRequest` or read the
//! server's `S`/`N` answer: the replication connection does that itself, and
//! tokio-postgres does it for ordinary connections through the
//! [`MakeTlsConnect`] implementation here, which uses the same configuration.
//!
//! What each mode verifies:
//!
//! | sslmode       | root certificate available¹ | none available         |
//! |---------------|-----------------------------|------------------------|
//! | `disable`     | no TLS                      | no TLS                 |
//! | `prefer`      | chain (like `verify-ca`)    | nothing; plaintext if the server answers `N` |
//! | `require`     | chain (like `verify-ca`)    | nothing (encryption only) |
//! | `verify-ca`   | chain, not the host name    | error: set sslrootcert |
//! | `verify-full` | chain and host name or IP   | error: set sslrootcert |
//!
//! ¹ `sslrootcert`, else `~/.postgresql/root.crt` if it exists — libpq's
//! rule, kept for compatibility: a `require` user with that file gets the
//! chain checked. Unlike libpq, an `sslrootcert` file that is named but
//! missing is an error in every mode, not silently skipped.
//!
//! Even when nothing is verified, the handshake signature is, so the peer
//! holds the key of the certificate it presented and channel binding means
//! something. Unix sockets never use TLS (the server does not offer it
//! there). Client certificates and CRLs are not supported.
//!
//! The ring provider is passed explicitly to every configuration: nothing
//! here installs or relies on a process-wide default provider.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use sha2::Digest;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect};

use super::conninfo::{ConnInfo, Host, RootCert, SslMode};

/// The ALPN protocol PostgreSQL 17 registers; older servers ignore it.
const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// Why TLS could not be set up or negotiated.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A verifying mode without a root certificate.
    #[error(
        "sslmode={mode} verifies the server's certificate, but there is no root certificate to \
         verify it against ({} does not exist): set sslrootcert to the CA certificate file, or \
         sslrootcert=system to trust the operating system's CAs, or use sslmode=require to \
         encrypt without verifying",
        path.display()
    )]
    NoRootCert {
        /// The sslmode asked for.
        mode: SslMode,
        /// The default path that was tried.
        path: PathBuf,
    },
    /// The named root certificate file cannot be read.
    #[error("cannot read sslrootcert {}: {source}; check the path and its permissions", path.display())]
    ReadRootCert {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The root certificate file holds no usable certificate.
    #[error("sslrootcert {} {problem}; it must hold one or more PEM certificates (-----BEGIN CERTIFICATE-----)", path.display())]
    BadRootCert {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// `sslrootcert=system` but the trust store is empty or unreadable.
    #[error(
        "sslrootcert=system: no usable CA certificates in the operating system's trust store \
         ({detail}); install them (Debian: `apt-get install ca-certificates`) or set sslrootcert \
         to a CA file"
    )]
    NoSystemRoots {
        /// What the loader reported.
        detail: String,
    },
    /// The host cannot be used as a TLS server name.
    #[error("host `{host}` is not a valid DNS name or IP address for TLS; give the server's name")]
    BadServerName {
        /// The host as configured.
        host: String,
    },
    /// rustls refused the configuration.
    #[error("building the TLS configuration: {0}")]
    Config(String),
    /// The server's certificate did not verify.
    #[error(
        "the server's TLS certificate was refused: {0}; check that sslrootcert holds the CA \
         that signed it and, with sslmode=verify-full, that host is a name or address the \
         certificate lists"
    )]
    Certificate(#[source] io::Error),
    /// The handshake failed otherwise: a protocol mismatch or a broken
    /// connection.
    #[error("TLS handshake with the server failed: {0}")]
    Handshake(#[source] io::Error),
}

impl TlsError {
    /// Whether trying again later may succeed. A certificate that does not
    /// verify, or a configuration mistake, will not go away by itself; a
    /// broken connection may.
    pub fn is_transient(&self) -> bool {
        match self {
            TlsError::Handshake(_) => !self.rustls_error().is_some_and(|err| {
                matches!(
                    err,
                    rustls::Error::PeerIncompatible(_) | rustls::Error::NoCertificatesPresented
                )
            }),
            _ => false,
        }
    }

    /// Why the server's certificate was refused, if that is what failed.
    pub fn certificate_error(&self) -> Option<&CertificateError> {
        match self.rustls_error()? {
            rustls::Error::InvalidCertificate(err) => Some(err),
            _ => None,
        }
    }

    fn rustls_error(&self) -> Option<&rustls::Error> {
        match self {
            TlsError::Handshake(err) | TlsError::Certificate(err) => {
                err.get_ref()?.downcast_ref::<rustls::Error>()
            }
            _ => None,
        }
    }
}

/// Builds the TLS connector for `info`; `None` when no TLS is to be tried
/// (`sslmode=disable`, or a unix socket).
pub(crate) fn connector(info: &ConnInfo) -> Result<Option<TlsConnect>, TlsError> {
    connector_with_home(info, home_dir().as_deref())
}

/// [`connector`] with the home directory (for `~/.postgresql/root.crt`)
/// given, so tests need not change the environment.
fn connector_with_home(
    info: &ConnInfo,
    home: Option<&Path>,
) -> Result<Option<TlsConnect>, TlsError> {
    let host = match (&info.host, info.ssl_mode) {
        (Host::Unix(_), _) | (_, SslMode::Disable) => return Ok(None),
        (Host::Tcp(host), _) => host,
    };
    let server_name = server_name(host, info.hostaddr)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());

    let roots = match &info.ssl_root_cert {
        Some(RootCert::File(path)) => Some(load_root_file(path)?),
        Some(RootCert::System) => Some(load_system_roots()?),
        None => {
            let default = home
                .map(|home| home.join(".postgresql").join("root.crt"))
                .unwrap_or_else(|| PathBuf::from("~/.postgresql/root.crt"));
            if default.is_file() {
                Some(load_root_file(&default)?)
            } else if info.ssl_mode.verifies() {
                return Err(TlsError::NoRootCert {
                    mode: info.ssl_mode,
                    path: default,
                });
            } else {
                None
            }
        }
    };

    let verifier: Arc<dyn ServerCertVerifier> = match roots {
        None => Arc::new(EncryptOnly {
            provider: provider.clone(),
        }),
        Some(roots) => {
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|err| TlsError::Config(err.to_string()))?;
            if info.ssl_mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(ChainOnly { webpki })
            }
        }
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| TlsError::Config(err.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(Some(TlsConnect {
        config: Arc::new(config),
        server_name,
        mode: info.ssl_mode,
    }))
}

/// The name the certificate must carry: `host`, which may be an IP address.
fn server_name(host: &str, hostaddr: Option<IpAddr>) -> Result<ServerName<'static>, TlsError> {
    match ServerName::try_from(host.to_owned()) {
        Ok(name) => Ok(name),
        // A host that is no valid name but was given an address: the
        // address is what we connect to, so it is what we can check.
        Err(_) => hostaddr
            .map(ServerName::from)
            .ok_or_else(|| TlsError::BadServerName {
                host: host.to_owned(),
            }),
    }
}

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::Uid::effective())
                .ok()
                .flatten()
                .map(|user| user.dir)
        })
}

fn load_root_file(path: &Path) -> Result<RootCertStore, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::ReadRootCert {
        path: path.to_owned(),
        source,
    })?;
    let bad = |problem: String| TlsError::BadRootCert {
        path: path.to_owned(),
        problem,
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|err| bad(format!("is not valid PEM ({err})")))?;
        roots
            .add(cert)
            .map_err(|err| bad(format!("holds a certificate that cannot be used ({err})")))?;
    }
    if roots.is_empty() {
        return Err(bad("holds no certificate".to_owned()));
    }
    Ok(roots)
}

fn load_system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let detail = if found.errors.is_empty() {
            "none found".to_owned()
        } else {
            found
                .errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        };
        return Err(TlsError::NoSystemRoots { detail });
    }
    Ok(roots)
}

/// `require`/`prefer` without a root certificate: any certificate, but the
/// handshake must be signed with its key.
#[derive(Debug)]
struct EncryptOnly {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `verify-ca`: the full WebPKI check, less the host name. The WebPKI
/// verifier checks the chain before the name, so a name error means the
/// chain is good.
#[derive(Debug)]
struct ChainOnly {
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A TLS client for one server, configured for its `sslmode`. Cheap to
/// clone. Also a tokio-postgres [`MakeTlsConnect`], for the `ConnInfo`'s
/// [`tokio_postgres_config`](ConnInfo::tokio_postgres_config).
#[derive(Clone)]
pub(crate) struct TlsConnect {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    mode: SslMode,
}

impl fmt::Debug for TlsConnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConnect")
            .field("server_name", &self.server_name)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl TlsConnect {
    /// Runs the TLS handshake over `stream`, after the server answered `S`
    /// to `SSLRequest`.
    pub(crate) async fn handshake<S>(
        &self,
        stream: S,
    ) -> Result<tokio_rustls::client::TlsStream<S>, TlsError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(self.server_name.clone(), stream)
            .await
            .map_err(|err| {
                let refused = err
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                    .is_some_and(|err| matches!(err, rustls::Error::InvalidCertificate(_)));
                if refused {
                    TlsError::Certificate(err)
                } else {
                    TlsError::Handshake(err)
                }
            })
    }

    /// The sslmode this connector implements. With [`SslMode::Prefer`] the
    /// caller goes on in plaintext when the server answers `N`; with any
    /// other mode that answer is an error. (libpq's `prefer` also retries in
    /// plaintext after a failed handshake; whether to is the caller's call.)
    pub(crate) fn mode(&self) -> SslMode {
        self.mode
    }
}

/// The `tls-server-end-point` channel-binding data of a TLS session: a hash
/// of the server's certificate. `None` when there is no certificate or its
/// signature algorithm has no defined hash (e.g. Ed25519).
pub(crate) fn server_end_point<S>(stream: &tokio_rustls::client::TlsStream<S>) -> Option<Vec<u8>> {
    let (_, session) = stream.get_ref();
    end_point_hash(session.peer_certificates()?.first()?)
}

/// RFC 5929 §4.1: hash the DER certificate with its signature's hash
/// function, except that MD5 and SHA-1 are replaced by SHA-256.
pub(crate) fn end_point_hash(cert_der: &[u8]) -> Option<Vec<u8>> {
    Some(match signature_hash(cert_der)? {
        Hash::Sha224 => sha2::Sha224::digest(cert_der).to_vec(),
        Hash::Sha256 => sha2::Sha256::digest(cert_der).to_vec(),
        Hash::Sha384 => sha2::Sha384::digest(cert_der).to_vec(),
        Hash::Sha512 => sha2::Sha512::digest(cert_der).to_vec(),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hash {
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

/// DER content octets of the object identifiers we recognise.
const OID_RSA_PREFIX: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01]; // 1.2.840.113549.1.1
const OID_ECDSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01]; // 1.2.840.10045.4.1
const OID_ECDSA_SHA2_PREFIX: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03]; // 1.2.840.10045.4.3
const OID_HASH_PREFIX: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02]; // 2.16.840.1.101.3.4.2
const OID_SHA1: &[u8] = &[0x2b, 0x0e, 0x03, 0x02, 0x1a]; // 1.3.14.3.2.26

/// The hash function of a certificate's signature algorithm, with MD5 and
/// SHA-1 mapped to SHA-256.
fn signature_hash(cert_der: &[u8]) -> Option<Hash> {
    // Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }
    let (cert, _) = der_take(cert_der, 0x30)?;
    let (_tbs, rest) = der_any(cert)?;
    let (algorithm, _) = der_take(rest, 0x30)?;
    let (oid, params) = der_take(algorithm, 0x06)?;
    if let Some(&[last]) = oid.strip_prefix(OID_RSA_PREFIX) {
        return match last {
            4 | 5 | 11 => Some(Hash::Sha256), // md5, sha1, sha256 WithRSAEncryption
            12 => Some(Hash::Sha384),
            13 => Some(Hash::Sha512),
            14 => Some(Hash::Sha224),
            10 => pss_hash(params), // RSASSA-PSS: the hash is in the parameters
            _ => None,
        };
    }
    if oid == OID_ECDSA_SHA1 {
        return Some(Hash::Sha256);
    }
    match oid.strip_prefix(OID_ECDSA_SHA2_PREFIX)? {
        [1] => Some(Hash::Sha224),
        [2] => Some(Hash::Sha256),
        [3] => Some(Hash::Sha384),
        [4] => Some(Hash::Sha512),
        _ => None,
    }
}

/// RSASSA-PSS-params ::= SEQUENCE { hashAlgorithm [0] AlgorithmIdentifier
/// DEFAULT sha1, ... }
fn pss_hash(params: &[u8]) -> Option<Hash> {
    let (params, _) = der_take(params, 0x30)?;
    let Some((explicit, _)) = der_take(params, 0xa0) else {
        return Some(Hash::Sha256); // the default, SHA-1
    };
    let (algorithm, _) = der_take(explicit, 0x30)?;
    let (oid, _) = der_take(algorithm, 0x06)?;
    if oid == OID_SHA1 {
        return Some(Hash::Sha256);
    }
    match oid.strip_prefix(OID_HASH_PREFIX)? {
        [1] => Some(Hash::Sha256),
        [2] => Some(Hash::Sha384),
        [3] => Some(Hash::Sha512),
        [4] => Some(Hash::Sha224),
        _ => None,
    }
}

/// Splits one DER element with tag `tag` off `input`: (contents, rest).
fn der_take(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    if *input.first()? != tag {
        return None;
    }
    der_any(input)
}

/// Splits one DER element of any tag off `input`: (contents, rest).
fn der_any(input: &[u8]) -> Option<(&[u8], &[u8])> {
    let first = *input.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return None;
        }
        let len = input
            .get(2..2 + count)?
            .iter()
            .fold(0usize, |len, &byte| (len << 8) | usize::from(byte));
        (len, 2 + count)
    };
    let end = header.checked_add(len)?;
    Some((input.get(header..end)?, &input[end..]))
}

// ---------------------------------------------------------------------------
// tokio-postgres.

impl<S> MakeTlsConnect<S> for TlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = TlsConnect;
    type Error = TlsError;

    /// Ignores `domain`: the server name comes from the `ConnInfo` this
    /// connector was built for (tokio-postgres passes the same host).
    fn make_tls_connect(&mut self, _domain: &str) -> Result<TlsConnect, TlsError> {
        Ok(self.clone())
    }
}

impl<S> tokio_postgres::tls::TlsConnect<S> for TlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = TlsError;
    type Future = Pin<Box<dyn Future<Output = Result<PgTlsStream<S>, TlsError>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move { self.handshake(stream).await.map(PgTlsStream) })
    }
}

/// A TLS stream as tokio-postgres wants it: with channel-binding data.
#[derive(Debug)]
pub(crate) struct PgTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for PgTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        match server_end_point(&self.0) {
            Some(hash) => ChannelBinding::tls_server_end_point(hash),
            None => ChannelBinding::none(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    use rustls_pki_types::PrivateKeyDer;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Ca {
        cert: rcgen::Certificate,
        key: KeyPair,
    }

    impl Ca {
        fn new(name: &str) -> Ca {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.distinguished_name.push(DnType::CommonName, name);
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let cert = params.self_signed(&key).unwrap();
            Ca { cert, key }
        }

        /// A server certificate for `names` (DNS names or IP addresses).
        fn issue(&self, names: &[&str]) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
            let key = KeyPair::generate().unwrap();
            let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, "server");
            let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
            let key = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
            (cert.der().clone(), key)
        }

        fn write(&self, dir: &Path) -> PathBuf {
            let path = dir.join(format!("ca-{:p}.crt", self));
            std::fs::write(&path, self.cert.pem()).unwrap();
            path
        }
    }

    /// A TLS server on a loopback port that accepts one connection, answers
    /// `ok` and returns.
    async fn serve_once(cert: CertificateDer<'static>, key: PrivateKeyDer<'static>) -> u16 {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            if let Ok(mut tls) = acceptor.accept(socket).await {
                let _ = tls.write_all(b"ok").await;
                let _ = tls.shutdown().await;
            }
        });
        port
    }

    fn scratch_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "datum-tls-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn conn(s: &str, port: u16) -> ConnInfo {
        ConnInfo::parse_with_env(&format!("{s} port={port} user=u"), &|_| None).unwrap()
    }

    /// Connects to a server presenting `server` with the settings `s`, with
    /// `home` as the home directory; returns what the server said.
    async fn try_connect(
        s: &str,
        server: (CertificateDer<'static>, PrivateKeyDer<'static>),
        home: &Path,
    ) -> Result<Vec<u8>, TlsError> {
        let port = serve_once(server.0, server.1).await;
        let info = conn(s, port);
        let tls = connector_with_home(&info, Some(home))?.expect("a TLS mode");
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let mut stream = tls.handshake(tcp).await?;
        let mut said = Vec::new();
        stream.read_to_end(&mut said).await.unwrap();
        Ok(said)
    }

    fn unknown_issuer(err: &TlsError) -> bool {
        let text = err.to_string();
        !err.is_transient()
            && matches!(
                err.certificate_error(),
                Some(CertificateError::UnknownIssuer)
            )
            && text.contains("certificate was refused")
            && text.contains("sslrootcert")
    }

    fn wrong_name(err: &TlsError) -> bool {
        !err.is_transient()
            && matches!(
                err.certificate_error(),
                Some(
                    CertificateError::NotValidForName
                        | CertificateError::NotValidForNameContext { .. }
                )
            )
    }

    #[tokio::test]
    async fn sslmode_matrix() {
        let dir = scratch_dir();
        let home = dir.join("home");
        std::fs::create_dir_all(&home).unwrap();
        let ours = Ca::new("our CA");
        let other = Ca::new("other CA");
        let ours_pem = ours.write(&dir);
        let names = ["localhost", "127.0.0.1"];

        // require: encryption only, whoever signed the certificate.
        let said = try_connect("host=127.0.0.1 sslmode=require", other.issue(&names), &home)
            .await
            .expect("require accepts a certificate from an unknown CA");
        assert_eq!(said, b"ok");
        let said = try_connect("host=127.0.0.1 sslmode=prefer", other.issue(&names), &home).await;
        assert_eq!(said.expect("prefer is require when TLS is offered"), b"ok");

        // require with a root certificate verifies the chain, as libpq does.
        let s = format!(
            "host=127.0.0.1 sslmode=require sslrootcert={}",
            ours_pem.display()
        );
        let err = try_connect(&s, other.issue(&names), &home)
            .await
            .unwrap_err();
        assert!(unknown_issuer(&err), "{err}");

        // verify-ca: our CA yes, the other no, the name does not matter.
        let s = format!(
            "host=127.0.0.1 sslmode=verify-ca sslrootcert={}",
            ours_pem.display()
        );
        try_connect(&s, ours.issue(&names), &home)
            .await
            .expect("verify-ca, our CA");
        let err = try_connect(&s, other.issue(&names), &home)
            .await
            .unwrap_err();
        assert!(unknown_issuer(&err), "{err}");
        let s = format!(
            "host=db.example hostaddr=127.0.0.1 sslmode=verify-ca sslrootcert={}",
            ours_pem.display()
        );
        try_connect(&s, ours.issue(&names), &home)
            .await
            .expect("verify-ca ignores the host name");

        // verify-full: chain and name, by DNS name or IP address.
        for host in ["localhost", "127.0.0.1"] {
            let s = format!(
                "host={host} hostaddr=127.0.0.1 sslmode=verify-full sslrootcert={}",
                ours_pem.display()
            );
            try_connect(&s, ours.issue(&names), &home)
                .await
                .unwrap_or_else(|err| panic!("verify-full for {host}: {err}"));
        }
        let s = format!(
            "host=db.example hostaddr=127.0.0.1 sslmode=verify-full sslrootcert={}",
            ours_pem.display()
        );
        let err = try_connect(&s, ours.issue(&names), &home)
            .await
            .unwrap_err();
        assert!(wrong_name(&err), "{err}");
        let s = format!(
            "host=127.0.0.1 sslmode=verify-full sslrootcert={}",
            ours_pem.display()
        );
        let err = try_connect(&s, ours.issue(&["localhost"]), &home)
            .await
            .unwrap_err();
        assert!(wrong_name(&err), "IP not in the certificate: {err}");
        let err = try_connect(&s, other.issue(&names), &home)
            .await
            .unwrap_err();
        assert!(unknown_issuer(&err), "{err}");

        // ~/.postgresql/root.crt is the default root, and makes require verify.
        std::fs::create_dir_all(home.join(".postgresql")).unwrap();
        std::fs::copy(&ours_pem, home.join(".postgresql/root.crt")).unwrap();
        try_connect(
            "host=localhost sslmode=verify-full",
            ours.issue(&names),
            &home,
        )
        .await
        .expect("the default root certificate");
        let err = try_connect("host=127.0.0.1 sslmode=require", other.issue(&names), &home)
            .await
            .unwrap_err();
        assert!(unknown_issuer(&err), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_root_certificate_says_to_set_sslrootcert() {
        let dir = scratch_dir();
        let home = dir.join("home");
        for mode in ["verify-ca", "verify-full"] {
            let info = conn(&format!("host=db sslmode={mode}"), 5432);
            let err = connector_with_home(&info, Some(&home)).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(&format!("sslmode={mode}"))
                    && text.contains(".postgresql/root.crt does not exist")
                    && text.contains("set sslrootcert"),
                "{text}"
            );
        }
        let missing = dir.join("nope.pem");
        let info = conn(
            &format!("host=db sslmode=require sslrootcert={}", missing.display()),
            5432,
        );
        let err = connector_with_home(&info, Some(&home)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("cannot read sslrootcert") && text.contains("nope.pem"),
            "{text}"
        );
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let info = conn(
            &format!("host=db sslmode=verify-ca sslrootcert={}", empty.display()),
            5432,
        );
        let text = connector_with_home(&info, Some(&home))
            .unwrap_err()
            .to_string();
        assert!(text.contains("holds no certificate"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_tls_for_disable_and_unix_sockets() {
        for s in ["host=db sslmode=disable", "host=/tmp sslmode=require"] {
            assert!(connector(&conn(s, 5432)).unwrap().is_none(), "{s}");
        }
        let tls = connector(&conn("host=db", 5432)).unwrap().expect("prefer");
        assert_eq!(tls.mode(), SslMode::Prefer);
    }

    #[test]
    fn end_point_hash_follows_the_signature_algorithm() {
        let cert = |alg: &'static rcgen::SignatureAlgorithm| {
            let key = KeyPair::generate_for(alg).unwrap();
            CertificateParams::new(vec!["x".to_owned()])
                .unwrap()
                .self_signed(&key)
                .unwrap()
                .der()
                .to_vec()
        };
        let p256 = cert(&rcgen::PKCS_ECDSA_P256_SHA256);
        assert_eq!(
            end_point_hash(&p256),
            Some(sha2::Sha256::digest(&p256).to_vec())
        );
        let p384 = cert(&rcgen::PKCS_ECDSA_P384_SHA384);
        assert_eq!(
            end_point_hash(&p384),
            Some(sha2::Sha384::digest(&p384).to_vec())
        );
        assert_eq!(end_point_hash(&cert(&rcgen::PKCS_ED25519)), None);
        assert_eq!(end_point_hash(b"\x30\x03garbage"), None);
        assert_eq!(end_point_hash(b""), None);
    }

    #[test]
    fn pss_parameters_name_the_hash() {
        // AlgorithmIdentifier parameters of RSASSA-PSS with SHA-384, and
        // with the defaults (SHA-1, hence SHA-256).
        let sha384 = [
            0x30, 0x0f, 0xa0, 0x0d, 0x30, 0x0b, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03,
            0x04, 0x02, 0x02,
        ];
        assert_eq!(pss_hash(&sha384), Some(Hash::Sha384));
        assert_eq!(pss_hash(&[0x30, 0x00]), Some(Hash::Sha256));
    }

    #[tokio::test]
    async fn channel_binding_data_is_the_certificates_hash() {
        let ca = Ca::new("our CA");
        let (cert, key) = ca.issue(&["localhost"]);
        let port = serve_once(cert.clone(), key).await;
        let tls = connector_with_home(&conn("host=localhost sslmode=require", port), None)
            .unwrap()
            .unwrap();
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        // Through the tokio-postgres trait, as tokio-postgres drives it.
        let stream = tokio_postgres::tls::TlsConnect::connect(tls, tcp)
            .await
            .unwrap();
        assert_eq!(
            server_end_point(&stream.0),
            Some(sha2::Sha256::digest(&cert).to_vec())
        );
    }

    /// Against a real server: tokio-postgres over our TLS, with verify-full
    /// and channel binding required, so the server checks our end-point hash.
    #[tokio::test]
    async fn tokio_postgres_verifies_and_binds_to_a_real_server() {
        use pg_throwaway::{Cluster, PasswordAuth};
        let pg = Cluster::builder()
            .ssl(true)
            .start()
            .unwrap_or_else(|err| panic!("starting a throwaway PostgreSQL: {err}"));
        pg.create_login("tls_user", "pw", PasswordAuth::ScramSsl, "")
            .unwrap();
        let ca = pg.ca_cert().expect("an SSL cluster has a CA");
        let info: ConnInfo = format!(
            "host=localhost port={} user=tls_user password=pw dbname=postgres \
             sslmode=verify-full sslrootcert={}",
            pg.port(),
            ca.display()
        )
        .parse()
        .unwrap();
        let tls = connector(&info).unwrap().expect("TLS");
        let mut config = info.tokio_postgres_config();
        config.channel_binding(tokio_postgres::config::ChannelBinding::Require);
        let (client, connection) = config.connect(tls).await.expect("connecting over TLS");
        tokio::spawn(connection);
        let row = client
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        assert!(row.get::<_, bool>(0), "the session is encrypted");

        // Without TLS the ssl-only login is refused by pg_hba.conf.
        let mut plain = info.clone();
        plain.ssl_mode = SslMode::Disable;
        let Err(err) = plain
            .tokio_postgres_config()
            .connect(tokio_postgres::NoTls)
            .await
        else {
            panic!("an ssl-only login connected without TLS");
        };
        let text = err
            .as_db_error()
            .map(|db| db.message().to_owned())
            .unwrap_or_default();
        assert!(text.contains("pg_hba.conf rejects connection"), "{err:?}");
    }
}
