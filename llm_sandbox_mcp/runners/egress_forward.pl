# Runs in a sandbox that may reach the egress proxy, as `perl -e <this file> SOCKET PORT`: listens on
# 127.0.0.1:PORT of the sandbox's own loopback (its only network) and relays every connection to the proxy's
# UNIX socket SOCKET, mounted from the host. Prints "ready" once listening. Every Debian-based image has
# perl-base (Essential), and these modules are part of it. Killing it only cuts this sandbox off.
use strict;
use warnings;
use IO::Socket::INET;
use IO::Socket::UNIX;
use IO::Select;
use Socket qw(SOCK_STREAM);

my ($path, $port) = @ARGV;
$SIG{CHLD} = 'IGNORE';
$SIG{PIPE} = 'IGNORE';
my $server = IO::Socket::INET->new(
    LocalAddr => '127.0.0.1', LocalPort => $port, Listen => 64, ReuseAddr => 1, Proto => 'tcp'
) or die "egress relay: cannot listen on 127.0.0.1:$port: $!\n";
$| = 1;
print "ready\n";
while (1) {
    my $client = $server->accept or next;
    my $pid = fork;
    if (!defined $pid || $pid) {
        close $client;
        next;
    }
    close $server;
    my $proxy = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $path) or exit 1;
    my %peer = ("$client" => $proxy, "$proxy" => $client);
    my $select = IO::Select->new($client, $proxy);
    while ($select->count) {
        for my $from ($select->can_read) {
            my $to = $peer{"$from"};
            my $read = sysread($from, my $buffer, 65536);
            if (!$read) {
                $select->remove($from);
                shutdown($to, 1);
                next;
            }
            my $offset = 0;
            while ($offset < $read) {
                my $written = syswrite($to, $buffer, $read - $offset, $offset);
                exit 0 unless defined $written;
                $offset += $written;
            }
        }
    }
    exit 0;
}
