package mpirun

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"text/tabwriter"

	"github.com/gorun/gorun/internal/words"
	"github.com/gorun/gorun/rank"
)

// The commands that start the ranks: a remote host's agent command, and
// the rendering of every command for --dry-run and -v.

// remoteCommand is the shell command that runs gorun's agent on remote
// host hs with env, in dir.
func (p *plan) remoteCommand(hs *hostSpec, env []string, agentPath, dir string, cudaLocal bool) string {
	cfg := p.cfg
	var ars []AgentRank
	stdinRank := -1
	for _, r := range hs.ranks {
		ars = append(ars, AgentRank{Rank: r, Local: p.specs[r].slot.LocalRank})
		if r == cfg.StdinRank && cfg.Stdin != nil {
			stdinRank = r
		}
	}
	agent := []string{agentPath, "--" + AgentFlag, "--grace", cfg.Grace.String(), "--ranks", formatAgentRanks(ars)}
	if cudaLocal {
		agent = append(agent, "--cuda-local")
	}
	if stdinRank >= 0 {
		agent = append(agent, "--agent-stdin", strconv.Itoa(stdinRank))
	}
	agent = append(agent, "--", p.rprog)
	agent = append(agent, cfg.Args...)
	words := append([]string{"exec", "env"}, env...)
	words = append(words, agent...)
	return "cd " + shellQuote(dir) + " && " + shellJoin(words)
}

// commandLine renders a local rank's command for --dry-run and -v, with
// the secret redacted.
func (p *plan) commandLine(sp rankSpec, port string) string {
	words := []string{"env"}
	for _, kv := range sp.env {
		if kv = p.fill(kv, port); kv != "" {
			words = append(words, kv)
		}
	}
	words = append(words, rank.EnvSecret+"=<redacted>")
	words = append(words, sp.argv...)
	return "cd " + shellQuote(p.cfg.Dir) + " && " + shellJoin(words)
}

// hostCommandLine renders a remote host's command.
func (p *plan) hostCommandLine(hs *hostSpec, port string) string {
	w := make([]string, len(hs.argv))
	for i, a := range hs.argv {
		w[i] = p.fill(a, port)
	}
	return shellJoin(w) + "   # job secret on stdin"
}

// printCommands writes every local rank's and remote host's command.
func (p *plan) printCommands(w io.Writer, prefix, port string) {
	for _, sp := range p.specs {
		if !sp.remote {
			fmt.Fprintf(w, "%s[%d] %s\n", prefix, sp.slot.Rank, p.commandLine(sp, port))
		}
	}
	for _, hs := range p.remote {
		fmt.Fprintf(w, "%s[%s: %s] %s\n", prefix, hs.name, rank.List(hs.ranks), p.hostCommandLine(hs, port))
		for _, r := range hs.ranks {
			words := []string{"env", rank.EnvRank + "=" + strconv.Itoa(r), rank.EnvLocalRank + "=" + strconv.Itoa(p.specs[r].slot.LocalRank)}
			if p.cudaRank {
				words = append(words, "CUDA_VISIBLE_DEVICES="+strconv.Itoa(p.specs[r].slot.LocalRank))
			}
			words = append(words, rank.EnvSecret+"=<redacted>", p.rprog)
			words = append(words, p.cfg.Args...)
			fmt.Fprintf(w, "%s[%d] the agent on %s adds to the host's environment and runs: %s\n", prefix, r, hs.name, shellJoin(words))
		}
	}
}

func (p *plan) printDryRun() {
	w := p.cfg.Stdout
	fmt.Fprintf(w, "gorun: dry run: %s on %s, job %s, rendezvous %s\n",
		words.Plural(len(p.specs), "rank"), words.Plural(p.hosts, "host"), p.jobID, net.JoinHostPort(p.rdvIP, p.displayPort()))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RANK\tHOST\tLOCAL RANK\tLOCAL SIZE\tNODE RANK\tSTART")
	for _, sp := range p.specs {
		how := "exec"
		if sp.remote {
			how = p.launcherName()
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%s\n", sp.slot.Rank, sp.slot.Host, sp.slot.LocalRank, sp.slot.LocalSize, sp.slot.NodeRank, how)
	}
	tw.Flush()
	p.printCommands(w, "", p.displayPort())
}

func (p *plan) displayPort() string {
	if p.rdvPort == "0" {
		return rdvPortPlaceholder
	}
	return p.rdvPort
}

func (p *plan) launcherName() string {
	if p.cfg.LaunchAgent != "" {
		return "launch-agent"
	}
	return "ssh"
}
