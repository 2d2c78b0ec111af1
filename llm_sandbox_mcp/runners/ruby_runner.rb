# Runs inside a pooled sandbox as `ruby -e <this file>` under runners/supervisor.pl, started before the program
# exists: the interpreter's start-up is paid in the pool. It reads the program from stdin, writes it to
# /workspace/main.rb and loads it as `ruby main.rb` would run it ($0, __FILE__, exit status, backtraces
# without this runner's frames). Gems installed into the cache are on GEM_PATH (set by the server).
source = $stdin.binmode.read
File.binwrite("main.rb", source)
$stdin.reopen(File::NULL)
$0 = "main.rb"
begin
  load "main.rb"
rescue SystemExit, SignalException
  raise
rescue SyntaxError => e
  $stderr.puts(e.message)
  exit 1
rescue Exception => e # rubocop:disable Lint/RescueException -- re-raised: Ruby reports it and exits 1
  if e.backtrace
    e.set_backtrace(e.backtrace.reject { |line| line.start_with?("-e:") }.map { |line| line.sub("<top (required)>", "<main>") })
  end
  raise e
end
