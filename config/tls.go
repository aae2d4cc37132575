package config

import (
	"crypto/tls"
	"crypto/x509"
)

// TLSVersion returns the crypto/tls constant of a validated tls_min_version ("1.2" or "1.3"; "" is 1.2).
func TLSVersion(v string) uint16 {
	if v == "1.3" {
		return tls.VersionTLS13
	}
	return tls.VersionTLS12
}

// tls checks a section's tls_cert_file, tls_key_file (both or neither, readable, a matching pair),
// tls_client_ca_file (readable, PEM certificates; it needs a key pair) and tls_min_version. The same loads
// run again at every change of the files (certfile), which keeps the old pair when they fail.
func (v *validator) tls(section, cert, key, clientCA, minVersion string) {
	if minVersion != "1.2" && minVersion != "1.3" {
		v.addf(section+".tls_min_version", "must be \"1.2\" or \"1.3\", got %q", minVersion)
	}
	if (cert == "") != (key == "") {
		v.addf(section+".tls_cert_file", "tls_cert_file and tls_key_file go together")
		return
	}
	if clientCA != "" {
		if cert == "" {
			v.addf(section+".tls_client_ca_file", "needs tls_cert_file and tls_key_file: client certificates are asked for over TLS")
		}
		if pem, ok := v.readable(section+".tls_client_ca_file", clientCA); ok && !x509.NewCertPool().AppendCertsFromPEM(pem) {
			v.addf(section+".tls_client_ca_file", "cannot use %q: no PEM certificate in it", clientCA)
		}
	}
	if cert == "" {
		return
	}
	_, okCert := v.readable(section+".tls_cert_file", cert)
	_, okKey := v.readable(section+".tls_key_file", key)
	if okCert && okKey {
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			v.addf(section+".tls_cert_file", "cannot load the key pair %q and %q: %s", cert, key, err)
		}
	}
}
