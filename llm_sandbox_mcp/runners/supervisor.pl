# The warm runner of every language without its own kernel: runs inside a pooled one-shot sandbox as
# `perl -e <this file> -- RUNTIME ARGV...` and speaks the frame protocol of runners/python_kernel.py with the
# server on its stdin/stdout. At start it spawns the language's runtime (node, ruby, R, a JVM, sh for the
# compiled languages) with pipes for stdin, stdout and stderr, so the runtime's start-up is paid while the
# sandbox waits in the pool; the runtime blocks reading the program from stdin. Then:
#   server -> runner  R header-JSON "\n" program bytes     (header: {"artifact_limit": N, ...})
#   runner -> server  H {"pid"}  O/E output  F {"name", "size", "inline"} "\n" data  D {"exit", "clean"}
# Compiled languages (LLM_SANDBOX_BUILD_PIPE set, see runners/go_run.sh): the runtime gets one more pipe as fd 3,
# which the run script writes a fresh build's binary to and closes before it runs the program; this runner
# sends what it carries as B frames (up to the header's "build_limit" bytes) and, once it is closed,
# b {"size": all bytes read}. A header "binary": N says the program's first N bytes are a binary built
# before, written to ./main before the rest reaches the runtime.
# Once the program has exited, every other process of the sandbox user that did not exist when this runner
# started is SIGKILLed, again until /proc shows none, and only then are the output files read: nothing of
# the program still runs while they are collected. When that cannot be achieved, D says "clean": false and
# carries no files, and the server kills and collects from outside. Uses perl-base only (every Debian and
# Ubuntu image has it). Prints nothing of its own.
use strict;
use warnings;
use POSIX qw(:sys_wait_h setsid dup2 _exit);
use Fcntl qw(O_RDONLY O_WRONLY O_CREAT O_EXCL O_NOFOLLOW O_NONBLOCK F_GETFL F_SETFL F_SETFD S_ISREG S_ISDIR);
use Errno qw(EAGAIN EINTR);

my $OUT = $ENV{OUTPUT_DIR} || "/workspace/outputs";
my $MAX_FILES = 200;
my $MAX_NAME = 1024;
my $KILL_SECONDS = 3;
$SIG{PIPE} = "IGNORE";

# Not dumpable: other processes of the sandbox user cannot open this runner's descriptors through
# /proc/<pid>/fd, ptrace it or read its memory. prctl(PR_SET_DUMPABLE, 0); the number is per architecture.
my %PRCTL = (x86_64 => 157, aarch64 => 167, armv7l => 172, ppc64le => 171, s390x => 172, riscv64 => 167);
my $arch = (POSIX::uname())[4];
syscall($PRCTL{$arch}, 4, 0, 0, 0, 0) if exists $PRCTL{$arch};

sub write_all {
    my ($fd_handle, $data) = @_;
    while (length $data) {
        my $n = syswrite($fd_handle, $data);
        if (!defined $n) {
            next if $! == EINTR;
            exit 0;  # the server is gone
        }
        substr($data, 0, $n, "");
    }
}

sub send_frame {
    my ($kind, $payload) = @_;
    write_all(\*STDOUT, pack("aN", $kind, length $payload) . $payload);
}

sub read_exactly {
    my ($size) = @_;
    my $data = "";
    while (length($data) < $size) {
        my $n = sysread(STDIN, $data, $size - length($data), length $data);
        if (!defined $n) {
            next if $! == EINTR;
            exit 0;
        }
        exit 0 if $n == 0;
    }
    return $data;
}

sub json_string {
    my ($text) = @_;
    $text =~ s/(["\\])/\\$1/g;
    $text =~ s/([\x00-\x1f])/sprintf("\\u%04x", ord $1)/ge;
    return "\"$text\"";
}

sub proc_info {
    # (real uid, start time, state, session) of a process, or () once it is gone.
    my ($pid) = @_;
    open(my $status, "<", "/proc/$pid/status") or return ();
    my $uid;
    while (my $line = <$status>) {
        if ($line =~ /^Uid:\s+(\d+)/) { $uid = $1; last }
    }
    close $status;
    open(my $stat, "<", "/proc/$pid/stat") or return ();
    my $text = <$stat> // "";
    close $stat;
    # The command name (field 2) may hold spaces and parentheses: fields are counted after its last ")".
    $text =~ s/^.*\)\s+// or return ();
    my @fields = split /\s+/, $text;
    return () unless defined $uid && @fields > 19;
    return ($uid, $fields[19], $fields[0], $fields[3]);
}

sub processes {
    opendir(my $dir, "/proc") or return ();
    my @pids = grep { /^\d+$/ } readdir $dir;
    closedir $dir;
    return @pids;
}

# What ran before this runner (PID 1, the engine's helpers, this runner's ancestors) is not the program's,
# nor is what PID 1 starts later in its own session (its sleep): the program runs in a session of its own
# (setsid below), and no process can join another session.
my %before;
for my $pid (processes()) {
    my @info = proc_info($pid);
    $before{"$pid:$info[1]"} = 1 if @info;
}
my $init_session = (proc_info(1))[3] // -1;

sub kill_the_rest {
    # True once no process of this user is left besides this runner and what predates it.
    my $deadline = time + $KILL_SECONDS;
    while (1) {
        my $left = 0;
        for my $pid (processes()) {
            next if $pid == $$ || $pid == 1;
            my ($uid, $started, $state, $session) = proc_info($pid);
            next unless defined $uid && $uid == $< && !$before{"$pid:$started"} && $session != $init_session;
            next if $state eq "Z" || $state eq "X";
            kill "KILL", $pid;
            $left++;
        }
        1 while waitpid(-1, WNOHANG) > 0;
        return 1 if !$left;
        return 0 if time > $deadline;
        select(undef, undef, undef, 0.001);
    }
}

my @argv = @ARGV;
shift @argv if @argv && $argv[0] eq "--";
pipe(my $in_r, my $in_w) or die "pipe: $!";
pipe(my $out_r, my $out_w) or die "pipe: $!";
pipe(my $err_r, my $err_w) or die "pipe: $!";
my ($build_r, $build_w);
if (defined $ENV{LLM_SANDBOX_BUILD_PIPE}) {
    pipe($build_r, $build_w) or die "pipe: $!";
}
mkdir $OUT;
my $child = fork();
die "fork: $!" unless defined $child;
if ($child == 0) {
    setsid();
    dup2(fileno $in_r, 0);
    dup2(fileno $out_w, 1);
    dup2(fileno $err_w, 2);
    if ($build_w) {
        # dup2 onto itself would keep the close-on-exec flag perl sets on every pipe.
        if (fileno $build_w == 3) { fcntl($build_w, F_SETFD, 0) } else { dup2(fileno $build_w, 3) }
    }
    $SIG{PIPE} = "DEFAULT";
    { no warnings "exec"; exec { $argv[0] } @argv; }
    print STDERR "cannot run $argv[0]: $!\n";
    _exit(127);
}
close $in_r;
close $out_w;
close $err_w;
close $build_w if $build_w;
send_frame("H", "{\"pid\": $$}");

my ($kind, $size) = unpack("aN", read_exactly(5));
exit 0 unless $kind eq "R";
my $payload = read_exactly($size);
my ($header, $program) = split /\n/, $payload, 2;
$program //= "";
undef $payload;  # a binary ahead of the program can be large: one copy is enough
my $budget = $header =~ /"artifact_limit"\s*:\s*(\d+)/ ? $1 : 0;
my $build_limit = $header =~ /"build_limit"\s*:\s*(\d+)/ ? $1 : 0;
my $binary = $header =~ /"binary"\s*:\s*(\d+)/ ? $1 : 0;
if ($binary && $binary <= length $program) {
    my $image = substr($program, 0, $binary, "");
    # A file that cannot be written leaves no ./main: the program then fails to start, as the server expects.
    if (sysopen(my $handle, "main", O_WRONLY | O_CREAT | O_EXCL, 0755)) {
        while (length $image) {
            my $n = syswrite($handle, $image);
            last unless $n;
            substr($image, 0, $n, "");
        }
        close $handle;
    }
}

for my $handle ($in_w, $out_r, $err_r, $build_r ? ($build_r) : ()) {
    my $flags = fcntl($handle, F_GETFL, 0);
    fcntl($handle, F_SETFL, $flags | O_NONBLOCK);
}
my %kinds = (fileno($out_r) => "O", fileno($err_r) => "E");
my %open = (fileno($out_r) => $out_r, fileno($err_r) => $err_r);
if ($build_r) {
    $kinds{fileno $build_r} = "B";
    $open{fileno $build_r} = $build_r;
}
my $built = 0;
my $pending = $program;
my $writing = 1;
my $wait_status;

sub forward {
    # Send what the pipe holds; false when it held nothing (at end of stream it is closed: true).
    my ($fd) = @_;
    my $n = sysread($open{$fd}, my $data, 65536);
    if (defined $n && $n > 0) {
        if ($kinds{$fd} eq "B") {
            $built += $n;
            send_frame("B", $data) if $built <= $build_limit;  # past the limit the server would not keep it
        } else {
            send_frame($kinds{$fd}, $data);
        }
        return 1;
    }
    return 0 unless defined $n;
    close $open{$fd};
    delete $open{$fd};
    send_frame("b", "{\"size\": $built}") if $kinds{$fd} eq "B" && $build_limit;
    return 1;
}

sub drain {
    # Forward what the pipes hold, without waiting for writers that stay alive: `wait` seconds at most for more.
    my ($wait) = @_;
    while (%open) {
        my $rbits = "";
        vec($rbits, $_, 1) = 1 for keys %open;
        last unless select(my $r = $rbits, undef, undef, $wait) > 0;
        my $progress = 0;
        for my $fd (keys %open) {
            $progress += forward($fd) if vec($r, $fd, 1);
        }
        last unless $progress;
    }
}

sub exit_status {
    my ($status) = @_;
    return WIFSIGNALED($status) ? 128 + WTERMSIG($status) : WEXITSTATUS($status);
}

while (1) {
    my ($rbits, $wbits) = ("", "");
    vec($rbits, $_, 1) = 1 for keys %open;
    if ($writing) {
        if (length $pending) {
            vec($wbits, fileno $in_w, 1) = 1;
        } else {
            close $in_w;
            $writing = 0;
        }
    }
    last if !%open && !$writing;
    my $ready = select(my $r = $rbits, my $w = $wbits, undef, 0.02);
    if ($ready > 0) {
        for my $fd (keys %open) {
            forward($fd) if vec($r, $fd, 1);
        }
        if ($writing && vec($w, fileno $in_w, 1)) {
            my $n = syswrite($in_w, $pending);
            if (defined $n) {
                substr($pending, 0, $n, "");
            } elsif ($! != EAGAIN && $! != EINTR) {
                $pending = "";  # the runtime stopped reading: the rest of the program is not needed
            }
        }
    }
    if (waitpid($child, WNOHANG) == $child) {
        $wait_status = $?;
        last;
    }
}
$wait_status = (waitpid($child, 0) == $child ? $? : 0) unless defined $wait_status;
close $in_w if $writing;
# Background processes may keep the pipes open: take what is there now, kill them, take the rest.
drain(0.02);
if (!kill_the_rest()) {
    send_frame("D", "{\"exit\": " . exit_status($wait_status) . ", \"clean\": false}");
    exit 0;
}
drain(0);

my @files;
sub walk {
    my ($dir, $prefix) = @_;
    opendir(my $handle, $dir) or return;
    my @names = sort grep { $_ ne "." && $_ ne ".." } readdir $handle;
    closedir $handle;
    for my $name (@names) {
        my $path = "$dir/$name";
        my $relative = $prefix eq "" ? $name : "$prefix/$name";
        my @info = lstat $path or next;
        if (S_ISDIR($info[2])) {
            walk($path, $relative);
        } elsif (S_ISREG($info[2]) && length($relative) <= $MAX_NAME) {
            my $copy = $relative;
            push @files, [$relative, $path, $info[7]] if utf8::decode($copy);
        }
    }
}
walk($OUT, "");
@files = (sort { $a->[0] cmp $b->[0] } @files)[0 .. ($#files < $MAX_FILES - 1 ? $#files : $MAX_FILES - 1)];
for my $file (@files) {
    my ($name, $path, $size) = @$file;
    my $inline = $size <= $budget;
    my $data = "";
    if ($inline) {
        # A file swapped for a link or FIFO is not followed.
        sysopen(my $handle, $path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK) or next;
        my @info = stat $handle;
        next unless S_ISREG($info[2]);
        while (length($data) < $size) {
            my $n = sysread($handle, $data, $size - length($data), length $data);
            last unless $n;
        }
        close $handle;
        $budget -= length $data;
        $size = length $data;
    }
    send_frame("F", "{\"name\": " . json_string($name) . ", \"size\": $size, \"inline\": "
        . ($inline ? "true" : "false") . "}\n$data");
}
send_frame("D", "{\"exit\": " . exit_status($wait_status) . ", \"clean\": true}");
