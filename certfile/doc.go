// Package certfile serves TLS with a key pair that follows its files: a certificate rotated on disk (by
// cert-manager, certbot, an operator's cp) is served to the next handshake without a restart, and a rotation
// that leaves the files broken or mismatched keeps the pair that worked.
//
// A Pair reads its certificate, key and optional client CA file at Open, then again when one of them changes
// (a poll of each file's mtime, size and inode every few seconds: a stat per file, no read) and when Reload is
// called (SIGHUP). Each change is logged with the new certificate's serial number and expiry.
package certfile
