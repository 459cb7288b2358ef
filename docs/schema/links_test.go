package schema_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// markdownLink matches [text](target) and captures the target.
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// The project's documentation links only to files in the repository: no
// link leaves it (../shared, the contract's drafts, is not part of the
// project), and every relative link names a file or folder that exists.
func TestDocsLinkOnlyToFilesInTheRepository(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, pattern := range []string{"*.md", "docs/*.md", "*/README.md", "*/*/README.md", "*/*/*/README.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, m...)
	}
	if len(docs) < 10 {
		t.Fatalf("only %d documents found under %s", len(docs), root)
	}
	links := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		if strings.Contains(string(b), "../shared") {
			t.Errorf("%s refers to ../shared, outside the repository", rel)
		}
		for _, m := range markdownLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			p := filepath.Clean(filepath.Join(filepath.Dir(doc), filepath.FromSlash(target)))
			if r, err := filepath.Rel(root, p); err != nil || strings.HasPrefix(r, "..") {
				t.Errorf("%s links to %s, outside the repository", rel, m[1])
				continue
			}
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s links to %s, which does not exist", rel, m[1])
			}
			links++
		}
	}
	if links < 20 {
		t.Errorf("only %d relative links checked", links)
	}
}
