// lincheck checks a key-value history recorded by Causeway's tests for
// linearizability with porcupine (github.com/anishathalye/porcupine).
//
// Input (stdin): a JSON array of operations
//
//	{"client": 0, "op": "get"|"put", "key": "k", "value": "v", "output": "v",
//	 "call": <ns>, "return": <ns>}
//	{"client": 0, "op": "mget", "keys": ["a", "b"], "outputs": ["1", ""],
//	 "call": <ns>, "return": <ns>}
//
// where a get's "output" is the value read ("" for nil), an mget reads
// several keys at once (one atomic snapshot), and a put whose outcome is
// unknown (it timed out) has "return" = -1: it may have taken effect at any
// time after its call. Exit status 0: linearizable; 1: not; 2: bad input or
// the check timed out.
package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

type op struct {
	Client  int      `json:"client"`
	Op      string   `json:"op"`
	Key     string   `json:"key"`
	Keys    []string `json:"keys"`
	Value   string   `json:"value"`
	Output  string   `json:"output"`
	Outputs []string `json:"outputs"`
	Call    int64    `json:"call"`
	Return  int64    `json:"return"`
}

type input struct {
	kind  string // put, get or mget
	keys  []string
	value string
}

// The state: every key's value. Keys are independent unless an mget spans
// them, so the history is split into groups of keys no mget connects, each
// checked on its own (linearizability is local).
type state map[string]string

func (s state) with(k, v string) state {
	n := make(state, len(s)+1)
	for kk, vv := range s {
		n[kk] = vv
	}
	n[k] = v
	return n
}

var model = porcupine.Model{
	Partition: partition,
	Init:      func() interface{} { return state{} },
	Step: func(st, in, output interface{}) (bool, interface{}) {
		s, i := st.(state), in.(input)
		switch i.kind {
		case "put":
			return true, s.with(i.keys[0], i.value)
		default:
			out := output.([]string)
			for n, k := range i.keys {
				if s[k] != out[n] {
					return false, s
				}
			}
			return true, s
		}
	},
	Equal: func(a, b interface{}) bool {
		x, y := a.(state), b.(state)
		if len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if w, ok := y[k]; !ok || w != v {
				return false
			}
		}
		return true
	},
	DescribeOperation: func(in, output interface{}) string {
		i := in.(input)
		if i.kind == "put" {
			return fmt.Sprintf("put(%s, %s)", i.keys[0], i.value)
		}
		return fmt.Sprintf("%s(%s) -> %q", i.kind, strings.Join(i.keys, ", "), output)
	},
}

// partition groups operations by connected keys (union-find over mgets).
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	parent := map[string]string{}
	var find func(string) string
	find = func(k string) string {
		if p, ok := parent[k]; ok && p != k {
			root := find(p)
			parent[k] = root
			return root
		}
		parent[k] = k
		return k
	}
	for _, o := range history {
		keys := o.Input.(input).keys
		for _, k := range keys[1:] {
			parent[find(k)] = find(keys[0])
		}
	}
	groups := map[string][]porcupine.Operation{}
	var order []string
	for _, o := range history {
		root := find(o.Input.(input).keys[0])
		if _, ok := groups[root]; !ok {
			order = append(order, root)
		}
		groups[root] = append(groups[root], o)
	}
	out := make([][]porcupine.Operation, 0, len(order))
	for _, r := range order {
		out = append(out, groups[r])
	}
	return out
}

func main() {
	var ops []op
	if err := json.NewDecoder(os.Stdin).Decode(&ops); err != nil {
		fmt.Fprintln(os.Stderr, "lincheck: bad history:", err)
		os.Exit(2)
	}
	history := make([]porcupine.Operation, 0, len(ops))
	for _, o := range ops {
		ret := o.Return
		if ret < 0 {
			ret = math.MaxInt64
		}
		in := input{kind: o.Op, keys: []string{o.Key}, value: o.Value}
		var out interface{} = []string{o.Output}
		switch o.Op {
		case "put", "get":
		case "mget":
			if len(o.Keys) == 0 || len(o.Keys) != len(o.Outputs) {
				fmt.Fprintln(os.Stderr, "lincheck: an mget needs as many outputs as keys")
				os.Exit(2)
			}
			in.keys, out = o.Keys, o.Outputs
		default:
			fmt.Fprintf(os.Stderr, "lincheck: unknown op %q\n", o.Op)
			os.Exit(2)
		}
		history = append(history, porcupine.Operation{ClientId: o.Client, Input: in, Call: o.Call, Output: out, Return: ret})
	}
	switch porcupine.CheckOperationsTimeout(model, history, 60*time.Second) {
	case porcupine.Ok:
		fmt.Printf("lincheck: %d operations are linearizable\n", len(history))
	case porcupine.Illegal:
		fmt.Printf("lincheck: %d operations are NOT linearizable\n", len(history))
		explain(history)
		os.Exit(1)
	default:
		fmt.Println("lincheck: the check timed out")
		os.Exit(2)
	}
}

// explain prints the operations of each group of keys whose own history
// fails, in call order, to show where to look.
func explain(history []porcupine.Operation) {
	for _, part := range model.Partition(history) {
		if porcupine.CheckOperations(model, part) {
			continue
		}
		sort.Slice(part, func(i, j int) bool { return part[i].Call < part[j].Call })
		fmt.Printf("keys %s:\n", strings.Join(part[0].Input.(input).keys, ", "))
		for _, o := range part {
			ret := fmt.Sprint(o.Return)
			if o.Return == math.MaxInt64 {
				ret = "?"
			}
			fmt.Printf("  [%d, %s] client %d %s\n", o.Call, ret, o.ClientId, model.DescribeOperation(o.Input, o.Output))
		}
	}
}
