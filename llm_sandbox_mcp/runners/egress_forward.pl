# Runs in a sandbox that may reach the egress proxy: `perl -e <this file> PORT` listens on 127.0.0.1:PORT of the
# sandbox's own loopback (its only network), prints "ready" once listening, and multiplexes every connection
# over its own stdout and stdin, the stream the server holds (egress/tunnel.py has the frames and the other
# end). Nothing of the server's filesystem is needed, so it works the same on every engine, local or not.
# Every Debian-based image has perl-base (Essential), and these modules are part of it. Killing it only cuts
# this sandbox off.
use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;

$SIG{PIPE} = 'IGNORE';

sub listen_on {
    my ($port) = @_;
    # A relay that is ending (its stream closed) may hold the port a little longer: wait for it, briefly.
    for my $attempt (1 .. 50) {
        my $server = IO::Socket::INET->new(
            LocalAddr => '127.0.0.1', LocalPort => $port, Listen => 64, ReuseAddr => 1, Proto => 'tcp'
        );
        return $server if $server;
        last unless $!{EADDRINUSE};
        select(undef, undef, undef, 0.1);
    }
    die "egress relay: cannot listen on 127.0.0.1:$port: $!\n";
}

# Frames, both ways: type (1 byte), stream id (4), payload length (4), big-endian, then the payload.
# This end opens streams; either end sends DATA, EOF (its direction is done), CLOSE (the stream is gone) and
# WINDOW (a 4-byte count: that many more bytes of DATA may come, as many as were delivered); the server's
# PING (stream 0) is answered with PING. Each direction
# of a stream starts with a window of credit (this end sends WINDOW_BYTES ahead; the server, whose window is
# larger, up to 1 MiB ahead), so a client that does not read holds up only itself, and no
# buffer here holds more than that per stream. At most MAX_STREAMS connections at once (more wait in the
# listen backlog).
use constant { OPEN => 1, DATA => 2, EOF => 3, CLOSE => 4, WINDOW => 5, PING => 6 };
use constant { HEADER => 9, CHUNK => 65536, MAX_PAYLOAD => 65536, MAX_STREAMS => 64, WINDOW_BYTES => 262144 };

sub emit {
    my ($type, $id, $data) = @_;
    $data = '' unless defined $data;
    my $frame = pack('CNN', $type, $id, length $data) . $data;
    my $offset = 0;
    while ($offset < length $frame) {
        my $written = syswrite(STDOUT, $frame, length($frame) - $offset, $offset);
        if (!defined $written) {
            next if $!{EINTR};
            exit 0;    # the server is gone
        }
        $offset += $written;
    }
}

sub mux {
    my ($port) = @_;
    my $server = listen_on($port);
    $server->blocking(0);
    binmode STDIN;
    binmode STDOUT;
    syswrite(STDOUT, "ready\n");
    my (%client, %pending, %reading, %shut, %closing, %credit);
    my $next = 0;
    my $input = '';
    my $stdin = \*STDIN;
    my $drop = sub {
        my ($id) = @_;
        close $client{$id} if $client{$id};
        delete $_->{$id} for (\%client, \%pending, \%reading, \%shut, \%closing, \%credit);
    };
    my $after_drain = sub {
        my ($id) = @_;
        return if length $pending{$id};
        if ($closing{$id}) {
            $drop->($id);
        } elsif ($shut{$id} && $shut{$id} == 1) {
            shutdown($client{$id}, 1);
            $shut{$id} = 2;
        }
    };
    my $dispatch = sub {
        my ($type, $id, $payload) = @_;
        return emit(PING, 0) if $type == PING;
        return unless $client{$id};
        if ($type == DATA) {
            $pending{$id} .= $payload;
        } elsif ($type == WINDOW) {
            $credit{$id} += unpack('N', $payload) if length $payload == 4;
        } elsif ($type == EOF) {
            $shut{$id} ||= 1;
            $after_drain->($id);
        } elsif ($type == CLOSE) {
            $closing{$id} = 1;
            $reading{$id} = 0;
            $after_drain->($id);
        }
    };
    while (1) {
        my $readers = IO::Select->new($stdin);
        my $writers = IO::Select->new();
        for my $id (keys %client) {
            $readers->add($client{$id}) if $reading{$id} && $credit{$id} > 0;
            $writers->add($client{$id}) if length $pending{$id};
        }
        $readers->add($server) if keys(%client) < MAX_STREAMS;
        my ($readable, $writable) = IO::Select->select($readers, $writers, undef);
        next unless $readable;
        my %id_of = map { ("$client{$_}" => $_) } keys %client;
        for my $handle (@$writable) {
            my $id = $id_of{"$handle"};
            next unless defined $id && $client{$id};
            my $written = syswrite($handle, $pending{$id});
            if (defined $written) {
                substr($pending{$id}, 0, $written) = '';
                emit(WINDOW, $id, pack('N', $written));
                $after_drain->($id);
            } elsif (!$!{EAGAIN} && !$!{EINTR}) {
                emit(CLOSE, $id);
                $drop->($id);
            }
        }
        for my $handle (@$readable) {
            if ($handle == $server) {
                my $accepted = $server->accept or next;
                $accepted->blocking(0);
                my $id = ++$next;
                $client{$id} = $accepted;
                ($pending{$id}, $reading{$id}, $credit{$id}) = ('', 1, WINDOW_BYTES);
                emit(OPEN, $id);
            } elsif ($handle == $stdin) {
                my $read = sysread(STDIN, $input, 65536, length $input);
                if (!defined $read) {
                    next if $!{EINTR} || $!{EAGAIN};
                    exit 0;
                }
                exit 0 if $read == 0;    # the server closed the stream: nothing can reach the proxy any more
                while (length $input >= HEADER) {
                    my ($type, $id, $size) = unpack('CNN', $input);
                    die "egress relay: a frame of $size bytes from the server\n" if $size > MAX_PAYLOAD;
                    last if length $input < HEADER + $size;
                    my $payload = substr($input, HEADER, $size);
                    substr($input, 0, HEADER + $size) = '';
                    $dispatch->($type, $id, $payload);
                }
            } else {
                my $id = $id_of{"$handle"};
                next unless defined $id && $client{$id} && $reading{$id};
                my $read = sysread($handle, my $buffer, $credit{$id} < CHUNK ? $credit{$id} : CHUNK);
                if (!defined $read) {
                    next if $!{EAGAIN} || $!{EINTR};
                    emit(CLOSE, $id);
                    $drop->($id);
                } elsif ($read == 0) {
                    $reading{$id} = 0;
                    emit(EOF, $id);
                } else {
                    $credit{$id} -= $read;
                    emit(DATA, $id, $buffer);
                }
            }
        }
    }
}

mux($ARGV[0]);
