package client_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer/client"
)

// docs/CLIENT.md's recipe to depend on the module from another repository
// works: a fresh module with the require and replace it gives, `go get` of
// the client package (offline: the module cache of this build) and a
// program using the client builds.
func TestDependFromAnotherModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module of its own")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	app := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(app, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/app\n\ngo 1.26.8\n")
	// The repository's go.sum vouches for the dependencies' hashes (as the
	// checksum database would online); tidy keeps the lines the app needs.
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sum))
	write("main.go", `package main

import (
	"context"
	"fmt"

	"github.com/sequencer-im/sequencer/client"
)

func main() {
	c, err := client.New(client.Config{Addrs: []string{"127.0.0.1:7070"}})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	_, err = c.Send(context.Background(), client.SendRequest{ConvID: "g:42", FromUID: 1001, Body: []byte("hi")})
	fmt.Println(client.ErrorCode(err))
}
`)
	env := append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod", "GOWORK=off")
	for _, args := range [][]string{
		{"mod", "edit", "-require=github.com/sequencer-im/sequencer@v0.0.0", "-replace=github.com/sequencer-im/sequencer=" + repo},
		{"get", "github.com/sequencer-im/sequencer/client"},
		{"build", "-o", os.DevNull, "."},
	} {
		cmd := exec.Command(goBin, args...)
		cmd.Dir, cmd.Env = app, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// docs/CLIENT.md's API list names every exported method of Client.
func TestClientDocListsEveryMethod(t *testing.T) {
	doc, err := os.ReadFile("../docs/CLIENT.md")
	if err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeFor[*client.Client]()
	for i := range typ.NumMethod() {
		name := typ.Method(i).Name
		if !strings.Contains(string(doc), "func (c *Client) "+name+"(") {
			t.Errorf("docs/CLIENT.md does not list Client.%s", name)
		}
	}
}
